//! Why an application could not attach, or stopped serving: the crate's
//! one public error.

/// Why an application could not attach, or stopped serving.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The engine answered no (wrong schema, unknown service, version):
    /// retrying cannot help.
    Refused(String),
    /// No engine there, or the connection broke (worth retrying: `run`
    /// does, forever).
    Unreachable(String),
    /// The runtime [`App::serve`](crate::App::serve) runs on could not be built.
    Runtime(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused(why) => write!(f, "the engine refused: {why}"),
            Error::Unreachable(why) => write!(f, "no engine to attach to: {why}"),
            Error::Runtime(e) => write!(f, "tokio runtime: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }
}
