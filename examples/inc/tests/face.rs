//! The RPC face in one process: a switch, a controller, a server agent, a
//! gRPC server with recording handlers and clients through the generated
//! `<Service>IncClient`. What the server's handlers see (ordinary fields
//! only), what the callers read (the network's results) and how bad
//! requests fail.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protoplane_grpc::{Code, Message, Request, Service, Status};
use protoplane_inc::client::ClientTuning;
use protoplane_inc::controller::ControllerTuning;
use protoplane_inc::faults::Faults;
use protoplane_inc::server::ServerTuning;
use protoplane_inc::switch::SwitchConfig;
use protoplane_inc_examples::generated::protoplane::examples::monitor::monitor_inc_client::MonitorIncClient;
use protoplane_inc_examples::generated::protoplane::examples::monitor::monitor_server::{
    Monitor, MonitorServer,
};
use protoplane_inc_examples::generated::protoplane::examples::monitor::{
    QueryReply, ReportReply, ReportRequestView,
};
use protoplane_inc_examples::generated::protoplane::examples::syncagg::trainer_inc_client::TrainerIncClient;
use protoplane_inc_examples::generated::protoplane::examples::syncagg::trainer_server::{
    Trainer, TrainerServer,
};
use protoplane_inc_examples::generated::protoplane::examples::syncagg::{
    GradientReply, GradientReplyBuilder, GradientReplyView, GradientRequest,
    GradientRequestBuilder, GradientRequestView,
};
use protoplane_inc_examples::harness::{registration, App};
use protoplane_inc_examples::{key_value, sync_agg};
use protoplane_inc_net::agent::{ClientHandle, ClientRuntime, Options, ServerRuntime};
use protoplane_inc_net::{controller, switch, LOOPBACK};
use protoplane_rpc::{Channel, Router, ServerOptions};
use protoplane_wire::Block;

/// What the handlers were given.
#[derive(Debug, Default)]
struct Seen {
    /// (host, whether the counters field was there) per report.
    reports: Mutex<Vec<(String, bool)>>,
    queries: Mutex<usize>,
    /// (step, whether the gradient field was there) per call.
    steps: Mutex<Vec<(u32, bool)>>,
}

struct Recorder(Arc<Seen>);

impl Monitor for Recorder {
    async fn report(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: ReportRequestView<'_> = request.message.typed()?;
        let mut r = self.0.reports.lock().expect("lock");
        r.push((req.host().to_string(), req.has_counters()));
        Ok(ReportReply::builder().finish())
    }

    async fn query(&self, _request: Request<Message>) -> Result<Block, Status> {
        *self.0.queries.lock().expect("lock") += 1;
        Ok(QueryReply::builder().finish())
    }
}

impl Trainer for Recorder {
    async fn aggregate(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: GradientRequestView<'_> = request.message.typed()?;
        self.0.steps.lock().expect("lock").push((req.step(), req.has_gradient()));
        let mut b = GradientReply::builder();
        let mut reply = GradientReplyBuilder::root(&mut b);
        reply.set_step(req.step() + 1000);
        // The server's own gradient is replaced by the network's.
        reply.gradient()?.extend_values([1e9])?;
        Ok(b.finish())
    }
}

/// A switch, a controller, a server agent and a gRPC server for `app`,
/// running until the returned flag is set.
struct World {
    opts: Options,
    rpc: SocketAddr,
    stop: Arc<AtomicBool>,
    rt: tokio::runtime::Runtime,
}

impl World {
    fn start(app: App, clients: u16, service: Arc<dyn Service>) -> World {
        let stop = Arc::new(AtomicBool::new(false));
        let (bound, sw) = switch::bind(switch::SwitchOptions {
            host: LOOPBACK,
            port: 0,
            control_port: 0,
            config: SwitchConfig::default(),
            faults: Faults::none(),
            port_faults: Vec::new(),
            seed: 1,
        })
        .expect("switch binds");
        let s = stop.clone();
        std::thread::spawn(move || sw.run(s));
        let (caddr, ctl) = controller::bind(controller::ControllerOptions {
            host: LOOPBACK,
            port: 0,
            switches: vec![bound.control],
            tuning: ControllerTuning::default(),
        })
        .expect("controller binds");
        let s = stop.clone();
        std::thread::spawn(move || ctl.run(s, |_| {}));
        let opts = Options {
            host: LOOPBACK,
            controller: caddr,
            switch_control: vec![bound.control],
            faults: Faults::none(),
            seed: 1,
        };
        let reg = registration(app, app.name(), clients).expect("registration");
        let mut server =
            ServerRuntime::register(&opts, reg, ServerTuning::default()).expect("registers");
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if server.step(Duration::from_millis(10)).is_err() {
                    return;
                }
            }
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio");
        let listener =
            rt.block_on(tokio::net::TcpListener::bind((LOOPBACK, 0))).expect("rpc listener");
        let rpc = listener.local_addr().expect("address");
        let router = Arc::new(Router::new(ServerOptions::default()).add_service(service));
        rt.spawn(router.serve(listener));
        World { opts, rpc, stop, rt }
    }

    fn agent(&self, app: App, member: u16) -> ClientHandle {
        ClientRuntime::join(&self.opts, app.name(), member, ClientTuning::default())
            .expect("joins")
            .spawn()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn ordinary_fields_reach_the_server_iedt_fields_do_not() {
    let seen = Arc::new(Seen::default());
    let world = World::start(App::KeyValue, 2, MonitorServer::new(Recorder(seen.clone())));
    let agents = [world.agent(App::KeyValue, 0), world.agent(App::KeyValue, 1)];
    world.rt.block_on(async {
        let mut clients = Vec::new();
        for a in agents {
            let channel = Channel::connect(&world.rpc.to_string()).await.expect("connects");
            clients.push(
                MonitorIncClient::new(channel, App::KeyValue.filter(), a).expect("filter fits"),
            );
        }
        let reports = [vec![(1, 5), (2, 7), (1 << 40, 3)], vec![(1, 10), (3, -4)]];
        for (m, c) in clients.iter().enumerate() {
            key_value::reporter(c, &format!("h{m}"), std::slice::from_ref(&reports[m]))
                .await
                .expect("reports");
        }
        let got = key_value::query(&clients[0], &[1, 2, 3, 1 << 40, 99, key_value::DONE])
            .await
            .expect("queries");
        assert_eq!(got, [15, 7, -4, 3, 0, 2]);
        let face = clients[0].inc().stats();
        assert_eq!((face.calls, face.rpcs), (3, 2), "a query makes no call: {face:?}");
        assert!(face.iedt_bytes > 0 && face.rpc_bytes > 0, "{face:?}");
    });
    // Reports arrive with their host and without their counters; queries
    // never reach the server (no ordinary field in them).
    let mut reports = seen.reports.lock().expect("lock").clone();
    reports.sort();
    assert_eq!(
        reports,
        [("h0".into(), false), ("h0".into(), false), ("h1".into(), false), ("h1".into(), false)]
    );
    assert_eq!(*seen.queries.lock().expect("lock"), 0);
}

#[test]
fn a_key_repeated_in_one_report_counts_with_its_last_value() {
    let world = World::start(App::KeyValue, 1, MonitorServer::new(Recorder(Arc::default())));
    let agent = world.agent(App::KeyValue, 0);
    world.rt.block_on(async {
        let channel = Channel::connect(&world.rpc.to_string()).await.expect("connects");
        let c = MonitorIncClient::new(channel, App::KeyValue.filter(), agent).expect("filter fits");
        // One report whose map has key 1 three times and key 2 twice: a
        // protobuf map keeps the last entry of each.
        let report = vec![(1, 5), (2, 7), (1, 100), (2, 1), (1, 9)];
        key_value::reporter(&c, "h", &[report]).await.expect("reports");
        let got = key_value::query(&c, &[1, 2]).await.expect("queries");
        assert_eq!(got, [9, 1]);
    });
}

#[test]
fn aggregation_results_replace_what_the_server_set() {
    let seen = Arc::new(Seen::default());
    let world = World::start(App::SyncAgg, 2, TrainerServer::new(Recorder(seen.clone())));
    let agents = [world.agent(App::SyncAgg, 0), world.agent(App::SyncAgg, 1)];
    let gradients = [vec![0.5, -1.25, 3.0], vec![0.25, 1.0, -0.000_001]];
    let sums = world.rt.block_on(async {
        let mut calls = Vec::new();
        for (m, a) in agents.into_iter().enumerate() {
            let channel = Channel::connect(&world.rpc.to_string()).await.expect("connects");
            let c = TrainerIncClient::new(channel, App::SyncAgg.filter(), a).expect("filter fits");
            let g = gradients[m].clone();
            calls.push(tokio::spawn(async move {
                let mut b = GradientRequest::builder();
                let mut req = GradientRequestBuilder::root(&mut b);
                req.set_step(7);
                req.gradient()?.extend_values(g)?;
                let reply = c.aggregate(Request::new(&b.finish())).await?;
                let reply: GradientReplyView<'_> = reply.typed()?;
                Ok::<_, Status>((reply.step(), reply.gradient().map(|g| g.values().to_vec())))
            }));
        }
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.expect("joins").expect("aggregates"));
        }
        out
    });
    for (step, sum) in sums {
        // The server's step, the network's sum (its own value is gone).
        assert_eq!(step, 1007);
        assert_eq!(sum, Some(vec![0.75, -0.25, 2.999_999]));
    }
    assert_eq!(*seen.steps.lock().expect("lock"), [(7, false), (7, false)]);
}

#[test]
fn bad_requests_and_filters_fail_clearly() {
    let world = World::start(App::SyncAgg, 1, TrainerServer::new(sync_agg::TrainerService));
    let agent = world.agent(App::SyncAgg, 0);
    world.rt.block_on(async {
        let channel = Channel::connect(&world.rpc.to_string()).await.expect("connects");
        // A filter for another service's messages does not fit.
        let e = TrainerIncClient::new(channel.clone(), App::KeyValue.filter(), agent.clone())
            .expect_err("the key-value filter names fields Trainer lacks");
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        let c = TrainerIncClient::new(channel, App::SyncAgg.filter(), agent).expect("fits");
        // A gradient value whose fixed-point form leaves 32 bits.
        let mut b = GradientRequest::builder();
        GradientRequestBuilder::root(&mut b)
            .gradient()
            .expect("opens")
            .extend_values([1e6])
            .expect("builds");
        let e = c.aggregate(Request::new(&b.finish())).await.expect_err("too large");
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        assert!(e.message.contains("32-bit"), "{e}");
        // A block of another type.
        let e = c
            .aggregate(Request::new(&GradientReply::builder().finish()))
            .await
            .expect_err("wrong type");
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        // A good call still works on the same channel.
        let sums = sync_agg::worker(&c, 3, &[vec![1.5, -2.0]]).await.expect("aggregates");
        // One member: the sum is its own, over every member (0).
        assert_eq!(sums, [(vec![1.5, -2.0], 0)]);
    });
}
