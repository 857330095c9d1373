//! What protoplane's tests share, so each test file says only what it
//! tests:
//!
//! * [`wire`]: protobuf bytes written by hand (varints, tags, fields, a
//!   small message builder), for inputs the encoders would never produce
//!   and for messages a test must not build with the code under test;
//! * [`net`]: servers on loopback ports and bounded waits: every wait in a
//!   test has a bound, so a broken server fails the test instead of
//!   hanging it (a bound is never a timing assertion);
//! * [`duplex`]: a gRPC server and a channel to it over an in-memory pipe,
//!   no socket at all;
//! * [`echo`]: a unary service that counts the calls it answers.

pub mod duplex;
pub mod echo;
pub mod net;
pub mod wire;
