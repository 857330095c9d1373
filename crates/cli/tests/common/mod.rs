//! What the process tests share: the `protoplane` binary run as a child
//! process (killed when dropped, its output read line by line), a runtime,
//! one interop call.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use protoplane_grpc::Code;
use protoplane_rpc::{CallOptions, Channel};

pub const BIN: &str = env!("CARGO_BIN_EXE_protoplane");

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn protoplane");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Proc { child, lines }
    }

    /// Waits for a line containing `what`; returns it.
    pub fn wait_for(&self, what: &str) -> String {
        let until = Instant::now() + Duration::from_secs(20);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("no line with {what:?}");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn engine(sock: &str) -> (Proc, String) {
    let e = Proc::start(&["engine", "--grpc-port", "0", "--attach", sock]);
    let line = e.wait_for("grpc listening on");
    let addr = line.rsplit(' ').next().unwrap_or_default().to_string();
    (e, addr)
}

pub fn app(sock: &str) -> Proc {
    Proc::start(&["interop-server", "--attach", sock])
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// An EmptyCall; its status code.
pub async fn empty_call(addr: &str) -> Code {
    let ch = match Channel::connect(addr).await {
        Ok(c) => c,
        Err(st) => return st.code,
    };
    let opts = CallOptions { timeout: Some(Duration::from_secs(5)), ..CallOptions::default() };
    let mut call = match ch.start("/grpc.testing.TestService/EmptyCall", opts).await {
        Ok(c) => c,
        Err(st) => return st.code,
    };
    if let Err(st) = call.send(&[]).await {
        return st.code;
    }
    call.close_send();
    while let Ok(Some(_)) = call.recv().await {}
    call.finish_status().await.code
}

pub fn sock_path(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("pp-split-{}-{name}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir.join("engine.sock").to_string_lossy().into_owned()
}
