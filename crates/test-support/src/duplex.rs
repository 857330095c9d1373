//! A gRPC server and a channel to it over an in-memory pipe: the whole
//! stack (HTTP/2 both ways, framing, the router, the handlers) with no
//! socket, no port and no kernel in the path.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use protoplane_rpc::{Channel, ChannelOptions, Router};

/// Bytes the pipe buffers each way before a writer waits.
const PIPE: usize = 256 << 10;

/// Serves one connection of `router` over an in-memory pipe and returns a
/// channel on its other end. The server task ends when the channel (and
/// every clone) is dropped.
pub async fn channel(router: Arc<Router>, opts: ChannelOptions) -> Channel {
    let (client, server) = tokio::io::duplex(PIPE);
    // The server sees a loopback peer: nothing else is true of a pipe.
    let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    tokio::spawn(router.serve_connection(server, peer));
    Channel::over(client, "in-memory", opts).await.expect("HTTP/2 handshake over the pipe")
}

#[cfg(test)]
mod tests {
    use super::*;
    use protoplane_rpc::{CallOptions, ServerOptions};

    #[tokio::test]
    async fn a_call_crosses_the_pipe() {
        let (router, _health) = Router::new(ServerOptions::default())
            .with_standard_services()
            .expect("the standard services");
        let ch = channel(Arc::new(router), ChannelOptions::default()).await;
        let mut call = crate::net::bounded(
            std::time::Duration::from_secs(20),
            "start",
            ch.start("/grpc.health.v1.Health/Check", CallOptions::default()),
        )
        .await
        .expect("started");
        // An empty HealthCheckRequest: the server as a whole.
        call.send_last(&[]).await.expect("sent");
        let reply = call.recv().await.expect("a reply").expect("one message");
        // HealthCheckResponse { status: SERVING (1) }.
        assert_eq!(&reply[..], crate::wire::Msg::new().varint(1, 1).finish());
        assert_eq!(call.finish_status().await.code, protoplane_grpc::Code::Ok);
    }
}
