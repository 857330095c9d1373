//! `protoplane interop-client`: the interop test cases, run against any
//! `grpc.testing.TestService` server. Each case checks what the interop
//! test descriptions require and fails with a message naming the first
//! difference.

use std::sync::Arc;
use std::time::Duration;

use protoplane_grpc::{Code, Message, Metadata, Schema, Status};
use protoplane_rpc::{CallOptions, Channel, ChannelOptions, Client, ClientTls, TypedCall};
use protoplane_wire::{Block, Builder, MessageBuilder, MessageView, Value};

use super::Types;

#[derive(clap::Args, Debug)]
pub(crate) struct ClientArgs {
    /// Server host.
    #[arg(long = "server_host", default_value = "localhost")]
    server_host: String,
    /// Server port.
    #[arg(long = "server_port", default_value_t = 10000)]
    server_port: u16,
    /// The test case (see `--help` for the list).
    #[arg(long = "test_case", default_value = "large_unary", value_parser = clap::builder::PossibleValuesParser::new(CASES))]
    test_case: String,
    /// Connect with TLS.
    #[arg(long = "use_tls")]
    use_tls: bool,
    /// PEM roots to trust with --use_tls.
    #[arg(long = "ca_file", value_name = "PEM")]
    ca_file: Option<std::path::PathBuf>,
    /// The server name to verify with --use_tls.
    #[arg(long = "server_host_override", default_value = "foo.test.google.fr")]
    server_host_override: String,
}

/// Every case this client runs: grpc-go's that need no cloud credentials,
/// plus protoplane's `huge_unary` (16 MiB each way) and the compression
/// cases of the interop descriptions.
pub(crate) const CASES: [&str; 17] = [
    "empty_unary",
    "large_unary",
    "client_streaming",
    "server_streaming",
    "ping_pong",
    "empty_stream",
    "status_code_and_message",
    "special_status_message",
    "custom_metadata",
    "unimplemented_method",
    "unimplemented_service",
    "timeout_on_sleeping_server",
    "cancel_after_begin",
    "cancel_after_first_response",
    "huge_unary",
    "client_compressed_unary",
    "server_compressed_unary",
];

struct Ctx {
    client: Client,
    schema: Arc<Schema>,
    t: Types,
}

type R = Result<(), String>;

fn st(s: Status) -> String {
    format!("unexpected status {s}")
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> R {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

impl Ctx {
    fn id(&self, service: &str, method: &str) -> Result<u32, String> {
        self.schema.find(service, method).ok_or_else(|| format!("no method {service}.{method}"))
    }

    fn test(&self, method: &str) -> Result<u32, String> {
        self.id("grpc.testing.TestService", method)
    }

    fn builder(&self, ty: u32) -> Result<Builder<'_>, String> {
        Builder::new(self.schema.tables(), ty).map_err(|e| e.to_string())
    }

    /// Sets message field `number` of `at` to a `Payload` of `size` zeros.
    fn payload(b: &mut Builder<'_>, at: MessageBuilder, number: u32, size: usize) -> R {
        let p = b.message(at, number).map_err(|e| e.to_string())?;
        if size > 0 {
            b.set(p, 2, Value::Bytes(&vec![0; size])).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn simple_request(&self, response_size: usize, payload: usize) -> Result<Block, String> {
        let mut b = self.builder(self.t.simple_request)?;
        let root = b.root();
        b.set(root, 2, Value::I32(response_size as i32)).map_err(|e| e.to_string())?;
        Self::payload(&mut b, root, 3, payload)?;
        Ok(b.finish())
    }

    fn output_request(&self, sizes: &[usize], payload: usize) -> Result<Block, String> {
        let mut b = self.builder(self.t.output_request)?;
        let root = b.root();
        for &s in sizes {
            let p = b.message(root, 2).map_err(|e| e.to_string())?;
            b.set(p, 1, Value::I32(s as i32)).map_err(|e| e.to_string())?;
        }
        if payload > 0 {
            Self::payload(&mut b, root, 3, payload)?;
        }
        Ok(b.finish())
    }

    fn with_status(
        &self,
        ty: u32,
        status_field: u32,
        code: i32,
        msg: &str,
    ) -> Result<Block, String> {
        let mut b = self.builder(ty)?;
        let root = b.root();
        let s = b.message(root, status_field).map_err(|e| e.to_string())?;
        b.set(s, 1, Value::I32(code)).map_err(|e| e.to_string())?;
        b.set(s, 2, Value::String(msg.as_bytes())).map_err(|e| e.to_string())?;
        Ok(b.finish())
    }

    fn view<'a>(&'a self, m: &'a Message) -> Result<MessageView<'a>, String> {
        m.view(self.schema.tables()).map_err(|e| e.to_string())
    }

    /// Length of the body of the `Payload` in field `number`, checking it
    /// is all zeros.
    fn payload_len(&self, m: &Message, number: u32) -> Result<usize, String> {
        let v = self.view(m)?;
        let Some(p) = v.by_number(number).map_err(|e| e.to_string())?.and_then(|x| x.as_message())
        else {
            return Ok(0);
        };
        let body =
            p.by_number(2).map_err(|e| e.to_string())?.and_then(|x| x.as_bytes()).unwrap_or(&[]);
        expect(body.iter().all(|&b| b == 0), || "payload is not all zeros".into())?;
        Ok(body.len())
    }

    async fn start(&self, method: u32, opts: CallOptions) -> Result<TypedCall, String> {
        self.client.start(method, opts).await.map_err(st)
    }

    async fn unary_with(
        &self,
        method: u32,
        req: &Block,
        opts: CallOptions,
    ) -> Result<(Message, TypedCall), Status> {
        let mut call = self.client.start(method, opts).await?;
        call.send(req).await?;
        call.call.close_send();
        let m = call.message().await?.ok_or_else(|| Status::new(Code::Internal, "no response"))?;
        let end = call.call.finish_status().await;
        if end.code != Code::Ok {
            return Err(end);
        }
        Ok((m, call))
    }

    async fn large_unary(&self, req_size: usize, resp_size: usize) -> R {
        let req = self.simple_request(resp_size, req_size)?;
        let (m, _) = self
            .unary_with(self.test("UnaryCall")?, &req, CallOptions::default())
            .await
            .map_err(st)?;
        let n = self.payload_len(&m, 1)?;
        expect(n == resp_size, || format!("response payload {n} bytes, want {resp_size}"))
    }

    async fn run(&self, case: &str) -> R {
        match case {
            "empty_unary" => {
                let req = self.builder(self.t.empty)?.finish();
                let (m, _) = self.unary_with(self.test("EmptyCall")?, &req, CallOptions::default()).await.map_err(st)?;
                expect(m.wire().is_empty(), || format!("response of {} bytes, want 0", m.wire().len()))
            }
            "large_unary" => self.large_unary(271_828, 314_159).await,
            "huge_unary" => self.large_unary(16 << 20, 16 << 20).await,
            "client_streaming" => {
                let mut call = self.start(self.test("StreamingInputCall")?, CallOptions::default()).await?;
                for size in [27_182, 8, 1828, 45_904] {
                    let mut b = self.builder(self.t.input_request)?;
                    let root = b.root();
                    Self::payload(&mut b, root, 1, size)?;
                    call.send(&b.finish()).await.map_err(st)?;
                }
                call.call.close_send();
                let m = call.message().await.map_err(st)?.ok_or("no response")?;
                let v = self.view(&m)?;
                let total = v.by_number(1).map_err(|e| e.to_string())?.and_then(|x| x.as_i128()).unwrap_or(0);
                expect(total == 74_922, || format!("aggregated size {total}, want 74922"))?;
                let end = call.call.finish_status().await;
                expect(end.code == Code::Ok, || st(end))
            }
            "server_streaming" => {
                let sizes = [31_415, 9, 2653, 58_979];
                let mut call = self.start(self.test("StreamingOutputCall")?, CallOptions::default()).await?;
                call.send(&self.output_request(&sizes, 0)?).await.map_err(st)?;
                call.call.close_send();
                let mut got = Vec::new();
                while let Some(m) = call.message().await.map_err(st)? {
                    got.push(self.payload_len(&m, 1)?);
                }
                expect(got == sizes, || format!("response sizes {got:?}, want {sizes:?}"))
            }
            "ping_pong" => {
                let mut call = self.start(self.test("FullDuplexCall")?, CallOptions::default()).await?;
                for (resp, req) in [(31_415, 27_182), (9, 8), (2653, 1828), (58_979, 45_904)] {
                    call.send(&self.output_request(&[resp], req)?).await.map_err(st)?;
                    let m = call.message().await.map_err(st)?.ok_or("stream ended early")?;
                    let n = self.payload_len(&m, 1)?;
                    expect(n == resp, || format!("response {n} bytes, want {resp}"))?;
                }
                call.call.close_send();
                let extra = call.message().await.map_err(st)?;
                expect(extra.is_none(), || "a response after the last request".into())
            }
            "empty_stream" => {
                let mut call = self.start(self.test("FullDuplexCall")?, CallOptions::default()).await?;
                call.call.close_send();
                let m = call.message().await.map_err(st)?;
                expect(m.is_none(), || "a response on an empty stream".into())
            }
            "status_code_and_message" => self.status_case("test status message").await,
            "special_status_message" => {
                self.status_case("\t\ntest with whitespace\r\nand Unicode BMP \u{263A} and non-BMP \u{1F608}\t\n")
                    .await
            }
            "custom_metadata" => self.custom_metadata().await,
            "unimplemented_method" => {
                let req = self.builder(self.t.empty)?.finish();
                let r = self.unary_with(self.test("UnimplementedCall")?, &req, CallOptions::default()).await;
                expect_code(r.map(|_| ()), Code::Unimplemented)
            }
            "unimplemented_service" => {
                let id = self.id("grpc.testing.UnimplementedService", "UnimplementedCall")?;
                let req = self.builder(self.t.empty)?.finish();
                let r = self.unary_with(id, &req, CallOptions::default()).await;
                expect_code(r.map(|_| ()), Code::Unimplemented)
            }
            "timeout_on_sleeping_server" => {
                let opts = CallOptions { timeout: Some(Duration::from_millis(1)), ..CallOptions::default() };
                let mut call = match self.client.start(self.test("FullDuplexCall")?, opts).await {
                    Ok(c) => c,
                    Err(s) => return expect_code(Err(s), Code::DeadlineExceeded),
                };
                let r = async {
                    call.send(&self.output_request(&[], 27_182)?).await.map_err(|s| format!("{}", s.code as u32))?;
                    Ok::<_, String>(())
                }
                .await;
                let end = match r {
                    Ok(()) => call.call.finish_status().await,
                    Err(_) => call.call.status().cloned().unwrap_or_else(|| Status::new(Code::Unknown, "no status")),
                };
                expect_code(if end.code == Code::Ok { Ok(()) } else { Err(end) }, Code::DeadlineExceeded)
            }
            "cancel_after_begin" => {
                let mut call = self.start(self.test("StreamingInputCall")?, CallOptions::default()).await?;
                call.call.cancel();
                let end = call.call.finish_status().await;
                expect_code(Err(end), Code::Cancelled)
            }
            "cancel_after_first_response" => {
                let mut call = self.start(self.test("FullDuplexCall")?, CallOptions::default()).await?;
                call.send(&self.output_request(&[31_415], 27_182)?).await.map_err(st)?;
                let m = call.message().await.map_err(st)?.ok_or("no first response")?;
                let n = self.payload_len(&m, 1)?;
                expect(n == 31_415, || format!("response {n} bytes, want 31415"))?;
                call.call.cancel();
                let end = call.call.finish_status().await;
                expect_code(Err(end), Code::Cancelled)
            }
            "client_compressed_unary" => self.client_compressed().await,
            "server_compressed_unary" => self.server_compressed().await,
            other => Err(format!("unknown test case {other}")),
        }
    }

    async fn status_case(&self, msg: &str) -> R {
        let req = self.with_status(self.t.simple_request, 7, 2, msg)?;
        let r = self.unary_with(self.test("UnaryCall")?, &req, CallOptions::default()).await;
        match r {
            Err(s) if s.code == Code::Unknown && s.message == msg => {}
            Err(s) => {
                return Err(format!(
                    "unary: got {:?} {:?}, want UNKNOWN {msg:?}",
                    s.code, s.message
                ))
            }
            Ok(_) => return Err("unary: call succeeded".into()),
        }
        let req = self.with_status(self.t.output_request, 7, 2, msg)?;
        let mut call = self.start(self.test("FullDuplexCall")?, CallOptions::default()).await?;
        call.send(&req).await.map_err(st)?;
        call.call.close_send();
        let end = call.call.finish_status().await;
        expect(end.code == Code::Unknown && end.message == msg, || {
            format!("full duplex: got {:?} {:?}, want UNKNOWN {msg:?}", end.code, end.message)
        })
    }

    async fn custom_metadata(&self) -> R {
        let initial = "test_initial_metadata_value";
        let trailing = [0xab, 0xab, 0xab];
        let md = || -> Result<Metadata, String> {
            let mut md = Metadata::new();
            md.insert("x-grpc-test-echo-initial", initial).map_err(|e| e.to_string())?;
            md.insert_bin("x-grpc-test-echo-trailing-bin", &trailing).map_err(|e| e.to_string())?;
            Ok(md)
        };
        let check = |call: &mut TypedCall, what: &str| -> R {
            let h = call.call.headers_now().cloned().unwrap_or_default();
            expect(h.get("x-grpc-test-echo-initial") == Some(initial), || {
                format!("{what}: initial metadata {h:?}")
            })?;
            let t = call.call.trailers().cloned().unwrap_or_default();
            expect(t.get_bin("x-grpc-test-echo-trailing-bin") == Some(&trailing[..]), || {
                format!("{what}: trailing metadata {t:?}")
            })
        };
        let req = self.simple_request(314_159, 271_828)?;
        let opts = CallOptions { metadata: md()?, ..CallOptions::default() };
        let (_, mut call) =
            self.unary_with(self.test("UnaryCall")?, &req, opts).await.map_err(st)?;
        check(&mut call, "unary")?;
        let opts = CallOptions { metadata: md()?, ..CallOptions::default() };
        let mut call = self.start(self.test("FullDuplexCall")?, opts).await?;
        call.send(&self.output_request(&[314_159], 271_828)?).await.map_err(st)?;
        call.call.close_send();
        let mut n = 0;
        while call.message().await.map_err(st)?.is_some() {
            n += 1;
        }
        expect(n == 1, || format!("full duplex: {n} responses, want 1"))?;
        check(&mut call, "full duplex")
    }

    fn compressed_request(&self, expect_compressed: bool) -> Result<Block, String> {
        let mut b = self.builder(self.t.simple_request)?;
        let root = b.root();
        b.set(root, 2, Value::I32(314_159)).map_err(|e| e.to_string())?;
        Self::payload(&mut b, root, 3, 271_828)?;
        let e = b.message(root, 8).map_err(|e| e.to_string())?;
        b.set(e, 1, Value::Bool(expect_compressed)).map_err(|e| e.to_string())?;
        Ok(b.finish())
    }

    async fn client_compressed(&self) -> R {
        let id = self.test("UnaryCall")?;
        // Probe: the server must refuse an uncompressed request that says
        // it is compressed, or it cannot tell and the case means nothing.
        let probe =
            self.unary_with(id, &self.compressed_request(true)?, CallOptions::default()).await;
        expect_code(probe.map(|_| ()), Code::InvalidArgument)?;
        let z = CallOptions { compress: true, ..CallOptions::default() };
        let (m, _) = self.unary_with(id, &self.compressed_request(true)?, z).await.map_err(st)?;
        expect(self.payload_len(&m, 1)? == 314_159, || "compressed: wrong response size".into())?;
        let (m, _) = self
            .unary_with(id, &self.compressed_request(false)?, CallOptions::default())
            .await
            .map_err(st)?;
        expect(self.payload_len(&m, 1)? == 314_159, || "uncompressed: wrong response size".into())
    }

    async fn server_compressed(&self) -> R {
        let id = self.test("UnaryCall")?;
        for want in [true, false] {
            let mut b = self.builder(self.t.simple_request)?;
            let root = b.root();
            b.set(root, 2, Value::I32(314_159)).map_err(|e| e.to_string())?;
            Self::payload(&mut b, root, 3, 271_828)?;
            let c = b.message(root, 6).map_err(|e| e.to_string())?;
            b.set(c, 1, Value::Bool(want)).map_err(|e| e.to_string())?;
            let (m, call) =
                self.unary_with(id, &b.finish(), CallOptions::default()).await.map_err(st)?;
            expect(self.payload_len(&m, 1)? == 314_159, || "wrong response size".into())?;
            let got = call.call.last_compressed();
            expect(got == want, || format!("response compressed: {got}, want {want}"))?;
        }
        Ok(())
    }
}

fn expect_code(r: Result<(), Status>, want: Code) -> R {
    match r {
        Err(s) if s.code == want => Ok(()),
        Err(s) => Err(format!("got {s}, want {}", want.name())),
        Ok(()) => Err(format!("the call succeeded, want {}", want.name())),
    }
}

pub(crate) fn run(args: &ClientArgs) -> Result<(), String> {
    let schema = super::schema()?;
    let t = Types::of(&schema)?;
    let tls = if args.use_tls {
        let ca = args.ca_file.as_ref().ok_or("--use_tls needs --ca_file")?;
        let roots_pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        Some(ClientTls {
            server_name: args.server_host_override.clone(),
            roots_pem,
            identity: None,
        })
    } else {
        None
    };
    let opts = ChannelOptions { max_recv_message: 32 << 20, tls, ..ChannelOptions::default() };
    let rt = protoplane_load::host::runtime(2)?;
    let target = format!("{}:{}", args.server_host, args.server_port);
    rt.block_on(async move {
        let channel = Channel::connect_with(&target, opts).await.map_err(|e| e.to_string())?;
        let ctx = Ctx { client: Client::new(channel, schema.clone()), schema, t };
        ctx.run(&args.test_case).await
    })
}
