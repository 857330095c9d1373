//! The client's calls on the `h2` crate.

use std::future::poll_fn;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request as HttpRequest};
use tokio::io::{AsyncRead, AsyncWrite};

use protoplane_grpc::codec::{self, ACCEPT_ENCODING};
use protoplane_grpc::status::{Code, Status};

use super::server::{h2_status, write_data, write_headers};
use crate::client::{unavailable, CallOptions, ChannelOptions, USER_AGENT};
use crate::http2::client::Fields;

/// The HTTP/2 handshake on `io`; the connection is then driven by a task
/// of its own until it closes (calls on it then fail with UNAVAILABLE).
pub(crate) async fn handshake<IO>(
    io: IO,
    opts: &ChannelOptions,
) -> Result<SendRequest<Bytes>, Status>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(opts.stream_window)
        .initial_connection_window_size(opts.connection_window)
        .max_send_buffer_size(1 << 20)
        .handshake::<IO, Bytes>(io)
        .await
        .map_err(|e| unavailable(format!("HTTP/2 handshake: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// Opens a call's stream: `target` is (scheme, authority, path).
pub(crate) async fn open(
    send: &SendRequest<Bytes>,
    target: (&str, &str, &str),
    call: &CallOptions,
    grpc_timeout: Option<String>,
) -> Result<Stream, Status> {
    let (scheme, authority, path) = target;
    let mut req = HttpRequest::builder()
        .method("POST")
        .uri(format!("{scheme}://{authority}{path}"))
        .body(())
        .map_err(|e| Status::new(Code::InvalidArgument, format!("bad path {path:?}: {e}")))?;
    let h = req.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(http::header::TE, HeaderValue::from_static("trailers"));
    h.insert(http::header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    h.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
    if call.compress {
        h.insert("grpc-encoding", HeaderValue::from_static("gzip"));
    }
    if let Some(v) = grpc_timeout.and_then(|t| HeaderValue::from_str(&t).ok()) {
        h.insert("grpc-timeout", v);
    }
    write_headers(&call.metadata, h);
    let mut send = send.clone().ready().await.map_err(|e| h2_status(&e))?;
    let (response, stream) = send.send_request(req, false).map_err(|e| h2_status(&e))?;
    Ok(Stream { send: Some(stream), response: Some(response), body: None })
}

/// One call's stream.
pub(crate) struct Stream {
    send: Option<SendStream<Bytes>>,
    response: Option<ResponseFuture>,
    body: Option<RecvStream>,
}

fn fields(http: u16, ends: bool, headers: &HeaderMap) -> Fields {
    Fields::parse(http, ends, || headers.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())))
}

impl Stream {
    /// The response header block and whether it also ended the call.
    pub(crate) async fn head(&mut self) -> Result<(Fields, bool), Status> {
        // Polled in place, so a caller may drop this future and call
        // again (a hedged call races several heads).
        let Some(fut) = self.response.as_mut() else {
            return Err(Status::new(Code::Internal, "response headers taken"));
        };
        let resp = fut.await;
        self.response = None;
        let resp = resp.map_err(|e| h2_status(&e))?;
        let (parts, b) = resp.into_parts();
        let ends = b.is_end_stream();
        let f = fields(parts.status.as_u16(), ends, &parts.headers);
        if !ends {
            self.body = Some(b);
        }
        Ok((f, ends))
    }

    /// The next chunk of the response body; `None` at its end.
    pub(crate) async fn data(&mut self) -> Option<Result<Bytes, Status>> {
        let b = self.body.as_mut()?;
        match b.data().await? {
            Ok(chunk) => {
                let _ = b.flow_control().release_capacity(chunk.len());
                Some(Ok(chunk))
            }
            Err(e) => Some(Err(h2_status(&e))),
        }
    }

    /// The trailers after the body; `None` if the stream ended without.
    pub(crate) async fn trailers(&mut self) -> Result<Option<Fields>, Status> {
        let Some(b) = self.body.as_mut() else { return Ok(None) };
        let t = poll_fn(|cx| b.poll_trailers(cx)).await.map_err(|e| h2_status(&e))?;
        Ok(t.map(|h| fields(0, true, &h)))
    }

    pub(crate) fn can_send(&self) -> bool {
        self.send.is_some()
    }

    /// Sends one message (`end`: the last), compressed if asked.
    pub(crate) async fn send(
        &mut self,
        message: &[u8],
        gzip: bool,
        end: bool,
    ) -> Result<(), Status> {
        let frame = codec::frame_message(message, gzip, usize::MAX)?;
        let Some(stream) = self.send.as_mut() else {
            return Err(Status::new(Code::Internal, "request stream closed"));
        };
        write_data(stream, frame).await?;
        if end {
            self.close_send();
        }
        Ok(())
    }

    /// No more requests (END_STREAM).
    pub(crate) fn close_send(&mut self) {
        if let Some(mut s) = self.send.take() {
            let _ = s.send_data(Bytes::new(), true);
        }
    }

    /// The request side is over without END_STREAM (the call ended).
    pub(crate) fn drop_send(&mut self) {
        self.send = None;
    }

    /// Cancels the stream (RST_STREAM(CANCEL)) unless it ended.
    pub(crate) fn reset(&mut self) {
        if let Some(s) = self.send.as_mut() {
            s.send_reset(h2::Reason::CANCEL);
        }
        self.send = None;
        self.response = None;
        self.body = None;
    }
}
