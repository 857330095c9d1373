// pp-grpc-cpp-server: the gRPC C++ peer of protoplane's side-by-side RPC
// benchmark. It serves socialnetwork.SocialNetwork
// (protos/socialnetwork/social_network.proto) with the same trivial handlers
// as protoplane's benchmark server and the tonic peer (bench/peers-rpc), so a
// load generator pointed at any of them measures the RPC stack, not the
// application code.
//
// usage: pp-grpc-cpp-server [--port N] [--threads N]
//
// API: the asynchronous (completion-queue) API, not the callback API. With
// the async API the application owns the threads that poll: the server has
// exactly one ServerCompletionQueue and `--threads` threads (default 1: the
// main thread) call Next() on it. With the epoll1 poller (Linux's default in
// gRPC 1.51) the thread blocked in Next() is the one that polls the sockets,
// runs the HTTP/2 transport and then our handler, so one thread does all the
// serving work. The callback API instead runs handlers on threads that gRPC
// creates itself (1.51 has no public knob for how many), and the sync API
// runs a thread pool sized by SetSyncServerOption / ResourceQuota; neither
// can be held to one thread. ResourceQuota::SetMaxThreads and
// SetSyncServerOption only govern the sync server's thread pool, which an
// async-only server does not have, so they are not set here. What remains
// are gRPC's own housekeeping threads (timer manager, executor), which are
// idle while calls are served (see README.md for what a running server has).

#include <grpcpp/grpcpp.h>

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "social_network.grpc.pb.h"
#include "social_network.pb.h"

namespace {

namespace sn = socialnetwork;
using Service = sn::SocialNetwork::AsyncService;

const char kUsage[] =
    "usage: pp-grpc-cpp-server [--port N] [--threads N]\n"
    "\n"
    "  --port N      listen on 127.0.0.1:N; 0 (the default) picks a free port\n"
    "  --threads N   threads polling the completion queue (default 1: the main\n"
    "                thread polls and runs every handler)\n"
    "\n"
    "Prints `listening on 127.0.0.1:PORT` on stdout once bound, then serves until\n"
    "SIGTERM or ctrl-c.\n";

// Keeps a value alive without letting the compiler drop the load that
// produced it (the handlers' equivalent of std::hint::black_box).
template <class T>
inline void Consume(const T& value) {
  asm volatile("" : : "r"(value) : "memory");
}

// The benchmark handlers: each one touches its request's req_id (so the
// decoded request is used, as a real handler would) and answers the default
// reply; only Login builds a reply from the request.
void Handle(const sn::RegisterUserRequest& req, sn::Empty*) { Consume(req.req_id()); }
void Handle(const sn::ComposeMediaRequest& req, sn::Empty*) { Consume(req.req_id()); }
void Handle(const sn::ComposePostRequest& req, sn::Empty*) { Consume(req.req_id()); }
void Handle(const sn::StorePostRequest& req, sn::Empty*) { Consume(req.req_id()); }
void Handle(const sn::LoginRequest& req, sn::LoginReply* reply) {
  std::string token = "t";
  token += std::to_string(req.req_id());
  token += '-';
  token += req.username();
  reply->set_token(std::move(token));
}

// What the completion queue hands back: every tag is an Event.
class Event {
 public:
  virtual ~Event() = default;
  virtual void Proceed(bool ok) = 0;
};

// How a method asks the server for its next call (the generated
// Service::RequestX member functions have this shape).
template <class Req, class Reply>
using RequestFn = void (Service::*)(grpc::ServerContext*, Req*,
                                    grpc::ServerAsyncResponseWriter<Reply>*,
                                    grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                    void*);

// One unary call of one method, from the request for it to the end of its
// response. Each call object asks for the next call of its method as soon as
// its own has arrived, so there is always one call of every method waiting;
// calls that arrive meanwhile are queued by gRPC and matched at once.
template <class Req, class Reply>
class UnaryCall final : public Event {
 public:
  UnaryCall(Service* service, grpc::ServerCompletionQueue* cq, RequestFn<Req, Reply> request)
      : service_(service), cq_(cq), request_(request), writer_(&ctx_) {
    (service_->*request_)(&ctx_, &req_, &writer_, cq_, cq_, this);
  }

  void Proceed(bool ok) override {
    if (finishing_ || !ok) {
      // The response went out (or the call or the server went away).
      delete this;
      return;
    }
    new UnaryCall(service_, cq_, request_);
    Reply reply;
    Handle(req_, &reply);
    finishing_ = true;
    writer_.Finish(reply, grpc::Status::OK, this);
  }

 private:
  Service* service_;
  grpc::ServerCompletionQueue* cq_;
  RequestFn<Req, Reply> request_;
  grpc::ServerContext ctx_;
  Req req_;
  grpc::ServerAsyncResponseWriter<Reply> writer_;
  bool finishing_ = false;
};

// Drains the completion queue until it is shut down and empty.
void Poll(grpc::ServerCompletionQueue* cq) {
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) static_cast<Event*>(tag)->Proceed(ok);
}

bool ParseInt(const char* text, long min, long max, long* out) {
  char* end;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

int Usage(const std::string& err) {
  std::fprintf(stderr, "pp-grpc-cpp-server: %s\n\n%s", err.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long port = 0, threads = 1;
  for (int i = 1; i < argc; i++) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag != "--port" && flag != "--threads") return Usage("unknown argument \"" + flag + "\"");
    if (i + 1 >= argc) return Usage(flag + " needs a value");
    const char* value = argv[++i];
    bool good = flag == "--port" ? ParseInt(value, 0, 65535, &port)
                                 : ParseInt(value, 1, 1024, &threads);
    if (!good) {
      return Usage(flag == "--threads" && std::strcmp(value, "0") == 0
                       ? "--threads must be at least 1"
                       : flag + ": invalid value \"" + value + "\"");
    }
  }

  // SIGTERM and SIGINT are taken by a thread of ours that waits for them
  // (below); blocked here, before gRPC starts any thread, so that every
  // thread inherits the mask and none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Service service;
  grpc::ServerBuilder builder;
  int bound = 0;
  std::string addr = "127.0.0.1:" + std::to_string(port);
  builder.AddListeningPort(addr, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "pp-grpc-cpp-server: cannot listen on %s\n", addr.c_str());
    return 1;
  }

  // One waiting call per method before the port is announced.
  new UnaryCall<sn::RegisterUserRequest, sn::Empty>(&service, cq.get(),
                                                     &Service::RequestRegisterUser);
  new UnaryCall<sn::LoginRequest, sn::LoginReply>(&service, cq.get(), &Service::RequestLogin);
  new UnaryCall<sn::ComposeMediaRequest, sn::Empty>(&service, cq.get(),
                                                     &Service::RequestComposeMedia);
  new UnaryCall<sn::ComposePostRequest, sn::Empty>(&service, cq.get(),
                                                    &Service::RequestComposePost);
  new UnaryCall<sn::StorePostRequest, sn::Empty>(&service, cq.get(), &Service::RequestStorePost);

  // The driver reads this line to learn the port before it starts the load.
  std::printf("listening on 127.0.0.1:%d\n", bound);
  std::fflush(stdout);

  // Blocked in sigwait for the whole run (no CPU time): on SIGTERM or ctrl-c
  // it stops accepting calls, lets the open ones finish, then shuts the
  // queue down, which ends the pollers' loops once it is drained.
  std::thread stopper([&] {
    int sig;
    sigwait(&stop_signals, &sig);
    server->Shutdown();
    cq->Shutdown();
  });

  std::vector<std::thread> pollers;
  for (long i = 1; i < threads; i++) pollers.emplace_back(Poll, cq.get());
  Poll(cq.get());
  for (auto& t : pollers) t.join();
  stopper.join();
  return 0;
}
