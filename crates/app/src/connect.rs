//! The attach handshake, on a blocking Unix socket: the application's
//! `Hello` (its services and their schemas' digests), the engine's answer,
//! and the region it hands over (the shared part and the engine's half as
//! file descriptors, the doorbell). The layout is validated against the
//! files' sizes before anything is mapped, and the engine's half is mapped
//! read-only.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use protoplane_shm::attach::{self, Answer, Hello, VERSION};
use protoplane_shm::layout::Layout;
use protoplane_shm::{sys, Bell, Mapping};

use crate::Error;

/// What an accepted attach hands this process: the socket (its closing
/// tells that the engine went away), the layout, the mapping, the doorbell,
/// and how many lanes the engine wants (0 or 1: this one is all).
pub(crate) type Connected = (UnixStream, Layout, Arc<Mapping>, Bell, u16);

/// Attaches to the engine at `path`.
pub(crate) fn connect(path: &Path, hello: &Hello, sets: &[Vec<u8>]) -> Result<Connected, Error> {
    let un = |e: std::io::Error| Error::Unreachable(e.to_string());
    let sock = UnixStream::connect(path).map_err(un)?;
    sock.set_read_timeout(Some(Duration::from_secs(10))).map_err(un)?;
    let files: Vec<std::os::fd::OwnedFd> = match hello.schemas {
        true => {
            sets.iter().map(|s| attach::schema_file(s)).collect::<Result<_, _>>().map_err(un)?
        }
        false => Vec::new(),
    };
    let refs: Vec<&std::os::fd::OwnedFd> = files.iter().collect();
    attach::send(&sock, &hello.encode(), &refs).map_err(un)?;
    let (msg, fds) = attach::recv(&sock).map_err(un)?;
    let answer = Answer::decode(&msg).map_err(|e| Error::Refused(e.to_string()))?;
    let (layout, lanes) = match answer {
        Answer::Refuse(why) => return Err(Error::Refused(why)),
        Answer::Accept { version, layout, lanes, .. } if version == VERSION => (layout, lanes),
        Answer::Accept { version, .. } => {
            return Err(Error::Refused(format!("engine speaks version {version}")))
        }
    };
    let mut fds = fds.into_iter();
    let (Some(shared), Some(requests), Some(bell)) = (fds.next(), fds.next(), fds.next()) else {
        return Err(Error::Unreachable("the engine's answer lacks its descriptors".into()));
    };
    let lens = (sys::file_len(&shared).map_err(un)?, sys::file_len(&requests).map_err(un)?);
    layout.validate(Some(lens)).map_err(|e| Error::Refused(e.to_string()))?;
    // The engine's half read-only: the engine sealed it, and this process
    // has no business writing it.
    let map = Mapping::map_parts(&layout.app_parts(&shared, &requests)).map_err(un)?;
    let bell = Bell::from_fd(bell).map_err(un)?;
    Ok((sock, layout, Arc::new(map), bell, lanes))
}

/// `schema`'s files as a serialized `FileDescriptorSet`, for the HELLO.
pub(crate) fn descriptor_set(schema: &protoplane_grpc::Schema) -> Vec<u8> {
    use prost::Message as _;
    prost_types::FileDescriptorSet { file: schema.files().to_vec() }.encode_to_vec()
}
