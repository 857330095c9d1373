//! `protoplane`: the command line.
//!
//! Exit status: 0 success, 1 malformed input (one line on stderr naming the
//! message index, type, field number and byte offset), 2 usage errors
//! (bad flags, unreadable schema, unknown type).

mod conformance;
mod demo;
mod engine;
mod external;
mod inc;
mod interop;
mod schema_args;
mod sim;
mod sn;
mod telemetry_args;

use std::io::{self, Read, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use protoplane_schema::TableSet;
use protoplane_wire::{
    json, text, DecodeOptions, Decoder, EncodeOptions, Encoder, MessageView, Source,
};
use std::fmt::Write as _;

use protoplane_load::framing::Framing;
use schema_args::SchemaArgs;

#[derive(Parser, Debug)]
#[command(name = "protoplane", version, about = "protoplane: a table-driven protobuf / RPC engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the wire engine on the social-network service's requests and report.
    Demo(demo::DemoArgs),
    /// Benchmarks against the libraries a user would otherwise pick
    /// (wire, rpc, split, offload, inc; the `protoplane-bench` binary).
    #[command(disable_help_flag = true)]
    Bench(external::Args),
    /// Serve the social-network service over gRPC/HTTP2 (or, with
    /// --attach, as an application process of a running engine).
    Serve(sn::ServeArgs),
    /// Run the engine: transports, framing, decode and encode for
    /// applications attached over shared memory.
    Engine(engine::EngineArgs),
    /// Sends a command to a running engine's admin socket (status, reload).
    Admin(engine::AdminArgs),
    /// Serve gRPC's interop test service (grpc.testing.TestService).
    #[command(name = "interop-server")]
    InteropServer(interop::server::ServerArgs),
    /// Run one gRPC interop test case against a TestService server.
    #[command(name = "interop-client")]
    InteropClient(interop::client::ClientArgs),
    /// The in-network computation data plane: a Tofino-class switch
    /// pipeline in software, on a UDP port (control plane on TCP).
    Switch(inc::SwitchArgs),
    /// The in-network computation controller: registration, name lookup,
    /// data-plane memory, reclaiming dead applications.
    Controller(inc::ControllerArgs),
    /// In-network computation applications (`inc run`; the examples'
    /// `protoplane-inc` binary).
    #[command(disable_help_flag = true)]
    Inc(external::Args),
    /// Load-test a gRPC server (closed or open loop).
    Load(LoadCommand),
    /// Replay messages through the offload engine's decode and encode with
    /// transaction counting, modelled over PCIe, CXL and on-chip paths.
    Sim(sim::SimArgs),
    /// Load .proto files and print a per-type summary of the schema tables.
    Compile {
        #[command(flatten)]
        schema: SchemaArgs,
        /// Write the serialized table set to this file.
        #[arg(long, value_name = "FILE")]
        tables_out: Option<std::path::PathBuf>,
        /// Print every field of every type as well.
        #[arg(long)]
        fields: bool,
    },
    /// Decode messages from stdin and re-encode them to stdout.
    Roundtrip {
        #[command(flatten)]
        schema: SchemaArgs,
        #[command(flatten)]
        msg: MessageArgs,
        /// Deterministic serialization (map entries sorted by key).
        #[arg(long)]
        deterministic: bool,
        /// Decode in zero-copy view mode.
        #[arg(long)]
        view: bool,
        /// Decode with the simple reference decoder instead of the fast path.
        #[arg(long, conflicts_with = "view")]
        reference: bool,
    },
    /// Decode wire messages from stdin to proto3 JSON (one object per line)
    /// or to the text format.
    Decode {
        #[command(flatten)]
        schema: SchemaArgs,
        #[command(flatten)]
        msg: MessageArgs,
        /// The output: `json`, or `text` (protobuf's text format; with
        /// --delimited, each message after a `# message N` comment line).
        #[arg(long, value_enum, default_value_t = TextFormat::Json)]
        format: TextFormat,
        /// Text format: print unknown fields too, by number.
        #[arg(long)]
        print_unknown_fields: bool,
    },
    /// The testee Google's conformance runner drives
    /// (`conformance_test_runner … protoplane-testee`): its pipe protocol
    /// on stdin and stdout.
    #[command(name = "conformance-testee")]
    ConformanceTestee(conformance::TesteeArgs),
    /// Encode JSON lines (or one text-format message) from stdin to wire
    /// messages on stdout.
    Encode {
        #[command(flatten)]
        schema: SchemaArgs,
        #[command(flatten)]
        msg: MessageArgs,
        /// The input: `json` (one object per line), or `text` (protobuf's
        /// text format: all of stdin is one message).
        #[arg(long, value_enum, default_value_t = TextFormat::Json)]
        format: TextFormat,
        /// Deterministic serialization (map entries sorted by key).
        #[arg(long)]
        deterministic: bool,
        /// Skip members that name no field and enum names the enum does
        /// not declare, instead of refusing the input.
        #[arg(long)]
        ignore_unknown_fields: bool,
    },
}

/// The human-readable forms `decode` writes and `encode` reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum TextFormat {
    /// The proto3 JSON mapping.
    Json,
    /// Protobuf's text format.
    Text,
}

#[derive(clap::Args, Debug)]
struct MessageArgs {
    /// Fully qualified message type (e.g. `socialnetwork.LoginRequest`).
    #[arg(long = "type", value_name = "FULL.NAME")]
    type_name: String,
    /// Messages are varint-length-prefixed (a stream), not a single message.
    #[arg(long)]
    delimited: bool,
    /// Maximum sub-message nesting.
    #[arg(long, default_value_t = 100)]
    max_depth: u32,
}

/// A failure and the exit status it maps to.
/// `protoplane load`: the load generator's arguments, and spans.
#[derive(clap::Args, Debug)]
struct LoadCommand {
    #[command(flatten)]
    load: protoplane_load::LoadArgs,
    #[command(flatten)]
    telemetry: telemetry_args::TelemetryArgs,
}

enum Failure {
    Usage(String),
    Input(String),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs (and spans, for the commands that make or serve calls) through
    // `tracing`; the guard flushes spans not yet exported when it drops.
    let telemetry = match &cli.command {
        Command::Serve(a) => a.telemetry.init("protoplane-serve"),
        Command::Load(a) => a.telemetry.init("protoplane-load"),
        Command::Engine(a) => a.telemetry.init("protoplane-engine"),
        _ => telemetry_args::LogArgs::default().init(),
    };
    let telemetry = match telemetry {
        Ok(t) => t,
        Err(m) => {
            eprintln!("protoplane: {m}");
            return ExitCode::from(2);
        }
    };
    let outcome = run(cli, &telemetry);
    drop(telemetry);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("protoplane: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Input(m)) => {
            eprintln!("protoplane: {m}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli, telemetry: &protoplane_telemetry::Telemetry) -> Result<(), Failure> {
    match cli.command {
        Command::Bench(args) => external::run(external::BENCH, &args.args).map_err(Failure::Usage),
        Command::Serve(args) => sn::serve(&args, telemetry).map_err(Failure::Usage),
        Command::Switch(args) => inc::run_switch(&args).map_err(Failure::Usage),
        Command::Controller(args) => inc::run_controller(&args).map_err(Failure::Usage),
        Command::Inc(args) => external::run(external::INC, &args.args).map_err(Failure::Usage),
        Command::Engine(args) => engine::run(&args, telemetry).map_err(Failure::Usage),
        Command::Admin(args) => engine::admin(&args).map_err(Failure::Usage),
        Command::Sim(args) => {
            let report = sim::run(&args).map_err(Failure::Usage)?;
            write_stdout(report.as_bytes())
        }
        Command::Load(LoadCommand { load, .. }) => {
            let mut chain = protoplane_rpc::intercept::ClientChain::new();
            if telemetry.tracing() {
                chain = chain.with(protoplane_telemetry::ClientTracing);
            }
            let report = protoplane_load::command_with(&load, chain)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            write_stdout(report.as_bytes())
        }
        Command::ConformanceTestee(args) => conformance::run(&args).map_err(Failure::Usage),
        Command::InteropServer(args) => interop::server::run(&args).map_err(Failure::Usage),
        Command::InteropClient(args) => interop::client::run(&args).map_err(Failure::Input),
        Command::Demo(args) => {
            let report = demo::run(&args).map_err(Failure::Input)?;
            write_stdout(report.as_bytes())
        }
        Command::Compile { schema, tables_out, fields } => {
            let ts = schema.load().map_err(Failure::Usage)?;
            let mut out = String::new();
            summary(&ts, fields, &mut out);
            write_stdout(out.as_bytes())?;
            if let Some(path) = tables_out {
                std::fs::write(&path, ts.to_bytes())
                    .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
            }
            Ok(())
        }
        Command::Roundtrip { schema, msg, deterministic, view, reference } => {
            let (ts, ty) = load_type(&schema, &msg)?;
            let dopts =
                DecodeOptions { view, max_depth: msg.max_depth, ..DecodeOptions::default() };
            let eopts =
                EncodeOptions { deterministic, max_depth: msg.max_depth, ..Default::default() };
            let framing = Framing::new(msg.delimited);
            let input = read_stdin()?;
            let mut dec = Decoder::new();
            let mut enc = Encoder::new();
            let mut block = protoplane_wire::Block::new();
            let mut out = Vec::with_capacity(input.len());
            let mut encoded = Vec::new();
            for (index, item) in framing.messages(&input).enumerate() {
                let (at, bytes) =
                    item.map_err(|e| Failure::Input(format!("message {index}: {e}")))?;
                if reference {
                    block = protoplane_wire::reference::decode(&ts, ty, bytes, &dopts)
                        .map_err(|e| input_error(index, at, &e))?;
                } else {
                    dec.decode_into(&ts, ty, bytes, &dopts, &mut block)
                        .map_err(|e| input_error(index, at, &e))?;
                }
                encoded.clear();
                enc.encode_into(
                    &ts,
                    ty,
                    Source::viewing(block.as_bytes(), bytes),
                    &eopts,
                    &mut encoded,
                )
                .map_err(|e| Failure::Input(format!("message {index}: {e}")))?;
                framing.put(&mut out, &encoded);
            }
            write_stdout(&out)
        }
        Command::Decode { schema, msg, format, print_unknown_fields } => {
            let topts = text::TextOptions { print_unknown_fields };
            let (ts, ty) = load_type(&schema, &msg)?;
            let dopts =
                DecodeOptions { view: true, max_depth: msg.max_depth, ..DecodeOptions::default() };
            let framing = Framing::new(msg.delimited);
            let input = read_stdin()?;
            let mut dec = Decoder::new();
            let mut block = protoplane_wire::Block::new();
            let mut out = String::new();
            for (index, item) in framing.messages(&input).enumerate() {
                let (at, bytes) =
                    item.map_err(|e| Failure::Input(format!("message {index}: {e}")))?;
                dec.decode_into(&ts, ty, bytes, &dopts, &mut block)
                    .map_err(|e| input_error(index, at, &e))?;
                let src = Source::viewing(block.as_bytes(), bytes);
                let printed = match format {
                    TextFormat::Json => MessageView::new(&ts, src, ty)
                        .map_err(json::PrintError::from)
                        .and_then(|v| json::to_json(&v, &mut out))
                        .map(|()| out.push('\n'))
                        .map_err(|e| e.to_string()),
                    TextFormat::Text => {
                        if msg.delimited {
                            let _ = writeln!(out, "# message {index}");
                        }
                        MessageView::new(&ts, src, ty)
                            .map_err(text::PrintError::from)
                            .and_then(|v| text::to_text_with(&v, &mut out, &topts))
                            .map_err(|e| e.to_string())
                    }
                };
                printed.map_err(|e| Failure::Input(format!("message {index}: {e}")))?;
            }
            write_stdout(out.as_bytes())
        }
        Command::Encode { schema, msg, format, deterministic, ignore_unknown_fields } => {
            let jopts = json::JsonOptions { ignore_unknown_fields };
            let (ts, ty) = load_type(&schema, &msg)?;
            let eopts =
                EncodeOptions { deterministic, max_depth: msg.max_depth, ..Default::default() };
            let framing = Framing::new(msg.delimited);
            let input = read_stdin()?;
            let text = std::str::from_utf8(&input)
                .map_err(|e| Failure::Input(format!("input is not UTF-8: {e}")))?;
            let mut enc = Encoder::new();
            let mut out = Vec::new();
            let mut encoded = Vec::new();
            if format == TextFormat::Text {
                if msg.delimited {
                    return Err(Failure::Usage(
                        "--format text reads one message (all of stdin): no --delimited".into(),
                    ));
                }
                let block = text::from_text(&ts, ty, text).map_err(|e| {
                    Failure::Input(format!("message 0: type {}: {e}", msg.type_name))
                })?;
                enc.encode_into(&ts, ty, Source::owned(block.as_bytes()), &eopts, &mut out)
                    .map_err(|e| Failure::Input(format!("message 0: {e}")))?;
                return write_stdout(&out);
            }
            let lines = text.lines().filter(|l| !l.trim().is_empty());
            let mut count = 0;
            for (index, line) in lines.enumerate() {
                if !msg.delimited && index > 0 {
                    return Err(Failure::Usage(
                        "more than one JSON object: use --delimited for a stream".into(),
                    ));
                }
                let block = json::from_json_with(&ts, ty, line, &jopts).map_err(|e| {
                    Failure::Input(format!("message {index}: type {}: {e}", msg.type_name))
                })?;
                encoded.clear();
                enc.encode_into(&ts, ty, Source::owned(block.as_bytes()), &eopts, &mut encoded)
                    .map_err(|e| Failure::Input(format!("message {index}: {e}")))?;
                framing.put(&mut out, &encoded);
                count += 1;
            }
            if count == 0 && !msg.delimited {
                return Err(Failure::Input("message 0: no JSON object on stdin".into()));
            }
            write_stdout(&out)
        }
    }
}

fn load_type(schema: &SchemaArgs, msg: &MessageArgs) -> Result<(TableSet, u32), Failure> {
    let ts = schema.load().map_err(Failure::Usage)?;
    let ty = ts.message_by_name(&msg.type_name).ok_or_else(|| {
        let near = ts.nearest_message_names(&msg.type_name, 3);
        Failure::Usage(match near.is_empty() {
            true => format!(
                "no message type named {:?} (names are fully qualified: package.Message)",
                msg.type_name
            ),
            false => format!(
                "no message type named {:?}; did you mean {}?",
                msg.type_name,
                near.join(", ")
            ),
        })
    })?;
    Ok((ts, ty))
}

fn input_error(index: usize, at: usize, e: &protoplane_wire::DecodeError) -> Failure {
    Failure::Input(format!("message {index} (stream byte {at}): {e}"))
}

fn read_stdin() -> Result<Vec<u8>, Failure> {
    let mut input = Vec::new();
    io::stdin()
        .lock()
        .read_to_end(&mut input)
        .map_err(|e| Failure::Usage(format!("stdin: {e}")))?;
    Ok(input)
}

fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is the reader's choice, not our failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Usage(format!("stdout: {e}"))),
    }
}

fn summary(ts: &TableSet, fields: bool, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{:<48} {:>6} {:>6} {:>6} {:>7}",
        "type", "fields", "oneofs", "size", "depth"
    );
    for (i, m) in ts.messages().iter().enumerate() {
        let depth = ts.nesting_depth(i as u32).map_or("rec".to_string(), |d| d.to_string());
        let _ = writeln!(
            out,
            "{:<48} {:>6} {:>6} {:>6} {:>7}",
            ts.message_name(i as u32),
            m.fields.len,
            m.oneofs.len,
            m.size,
            depth
        );
        if fields {
            for f in ts.fields(m) {
                let label = match f.label {
                    protoplane_schema::Label::Optional => "optional",
                    protoplane_schema::Label::Required => "required",
                    protoplane_schema::Label::Repeated => "repeated",
                };
                let _ = writeln!(
                    out,
                    "    {:>9} {:<8} {:<9} {:<24} offset {:>4} flags {:#06x}",
                    f.number,
                    label,
                    f.kind.proto_name(),
                    ts.str(f.name),
                    f.offset,
                    f.flags.0
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "{} message types, {} enums, table set {} bytes",
        ts.messages().len(),
        ts.enums().len(),
        ts.to_bytes().len()
    );
}
