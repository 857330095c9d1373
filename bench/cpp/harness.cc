// protoplane side-by-side benchmark: protobuf C++ worker.
//
// This program implements the worker protocol of bench/README.md for the
// protobuf C++ library (Debian's libprotobuf, generated code from
// `protoc --cpp_out`). It contains no per-type code: it is linked with the
// generated `.pb.cc` files of exactly one schema (whose key is compiled in as
// PP_SCHEMA_KEY, see build.sh), and looks each job's message type up at run
// time in the *generated* descriptor pool. The prototype it gets back from
// the generated message factory is the generated default instance, so every
// `New()`, `ParseFromArray()`, `ByteSizeLong()` and serialize call below is a
// virtual call into the generated, table-driven fast code -- exactly what a
// C++ program that includes the generated header would run. (The only
// difference is one virtual dispatch per message, which a C++ user with a
// concrete type would usually also pay through `Message*`-based APIs, and
// which is noise next to parsing a message.)
//
// What is measured (all ops time whole passes over the job's messages; the
// reported value is nanoseconds per message):
//
//   decode_owned  `prototype->New()` + `ParseFromArray()` + `delete`, per
//                 message: a fresh heap message per input, as a caller that
//                 owns a new message per request does. Same work as prost's
//                 fresh decode, which also allocates and frees its output.
//   decode_reuse  one message reused for the whole job; `ParseFromArray()`
//                 clears it before parsing (documented behaviour), so string
//                 capacity, repeated-field capacity and sub-message objects
//                 allocated by earlier parses are reused. This is the usual
//                 C++ "keep a message around" optimisation.
//   decode_arena  the idiomatic high-throughput C++ pattern: one long-lived
//                 `Arena` constructed over a caller-owned initial block,
//                 message created with `prototype->New(&arena)`, parsed, and
//                 the arena `Reset()` after every message (Reset runs the
//                 registered destructors and keeps the initial block). The
//                 initial block is sized per job so that a parse of the
//                 job's largest message fits in it without the arena
//                 allocating further blocks: the best case for C++, which is
//                 what a tuned server does. Note that libprotobuf 3.21 still
//                 heap-allocates the character buffers of long strings on an
//                 arena; that cost is real and is included.
//   json_decode   `util::JsonStringToMessage()` of each message's JSON form
//                 (printed once, before timing, by `MessageToJsonString`)
//                 into one message reused for the whole job (it parses
//                 into a cleared message, keeping its allocations).
//   json_encode   `util::MessageToJsonString()` of each already-parsed
//                 message into one std::string reused for the whole job
//                 (cleared first: the function appends).
//   encode        for an already-parsed message: `ByteSizeLong()` (computes
//                 and caches sizes; part of the op because every serialize
//                 must do it) + `SerializeWithCachedSizesToArray()` into a
//                 preallocated buffer reused across iterations. This is the
//                 cheapest public serialization path (what SerializeToArray
//                 does minus its redundant checks), with no allocation, the
//                 same deal as encoding into a reused Vec on the Rust side.
//
// Every parse result is checked (a failed parse aborts the run) and consumed
// through an empty `asm volatile` with a memory clobber, so the compiler
// cannot drop or sink any of the work. Timing uses std::chrono::steady_clock
// around a whole sample (thousands of passes for small messages), so timer
// overhead is amortised.
//
// Before timing, each job is checked once: every op's decode path must
// reproduce the input when re-serialized (deterministically), and the
// timed encode path must produce the input bytes. Where the schema contains
// maps, the library's map order may legitimately differ from the input's;
// then the encodings must have equal length and be identical up to the order
// of map entries (checked on the wire, recursively); that is noted on stderr.
// Anything else exits 1.

#include <google/protobuf/arena.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <google/protobuf/unknown_field_set.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef PP_SCHEMA_KEY
#error "compile with -DPP_SCHEMA_KEY=\"<schema key>\" (see build.sh)"
#endif

namespace {

namespace pb = google::protobuf;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

// Makes the compiler assume `p` and everything reachable from it is read
// (and possibly written) here, so results cannot be optimised away.
inline void DoNotOptimize(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "pp-cpp-worker: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  for (;;) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? pos : pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

// Parses a non-negative decimal integer argument, or fails.
uint64_t ParseCount(const std::string& flag, const std::string& v) {
  if (v.empty() || v.size() > 12 ||
      v.find_first_not_of("0123456789") != std::string::npos) {
    Fail(flag + ": expected a non-negative integer, got '" + v + "'");
  }
  return std::strtoull(v.c_str(), nullptr, 10);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open " + path);
  std::string data((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad()) Fail("error reading " + path);
  return data;
}

// ---------------------------------------------------------------------------
// Command line and job file
// ---------------------------------------------------------------------------

const char* const kAllOps[] = {"decode_owned", "decode_reuse", "decode_arena",
                               "encode",       "json_decode",  "json_encode"};

struct Options {
  std::string jobs_path;
  std::vector<std::string> ops;
  uint64_t min_time_ms = 5;
  uint64_t samples = 7;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  std::string ops_arg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--jobs") {
      o.jobs_path = value();
    } else if (a == "--ops") {
      ops_arg = value();
    } else if (a == "--min-time-ms") {
      o.min_time_ms = ParseCount(a, value());
    } else if (a == "--samples") {
      o.samples = ParseCount(a, value());
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: %s --jobs FILE [--ops LIST] [--min-time-ms N] [--samples K]\n"
          "schema: %s\nops: decode_owned,decode_reuse,decode_arena,encode,"
          "json_decode,json_encode\n",
          argv[0], PP_SCHEMA_KEY);
      std::exit(0);
    } else {
      Fail("unknown argument '" + a + "' (see --help)");
    }
  }
  if (o.jobs_path.empty()) Fail("--jobs FILE is required");
  if (o.samples == 0) Fail("--samples must be at least 1");
  if (ops_arg.empty()) {
    o.ops.assign(std::begin(kAllOps), std::end(kAllOps));
  } else {
    for (const std::string& op : Split(ops_arg, ',')) {
      if (op.empty()) continue;
      if (std::find(std::begin(kAllOps), std::end(kAllOps), op) ==
          std::end(kAllOps)) {
        Fail("unknown op '" + op +
             "' (this worker has decode_owned, decode_reuse, decode_arena, "
             "encode, json_decode, json_encode)");
      }
      if (std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) {
        o.ops.push_back(op);
      }
    }
    if (o.ops.empty()) Fail("--ops selects no op");
  }
  return o;
}

struct Job {
  std::string dataset, bench, schema, type, message, framing, path;
  int line = 0;
};

std::vector<Job> ReadJobs(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::vector<Job> jobs;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<std::string> c = Split(line, '\t');
    if (c.size() != 7) {
      Fail(path + ":" + std::to_string(lineno) + ": expected 7 tab-separated " +
           "columns, got " + std::to_string(c.size()));
    }
    Job j{c[0], c[1], c[2], c[3], c[4], c[5], c[6], lineno};
    if (j.framing != "single" && j.framing != "delimited") {
      Fail(path + ":" + std::to_string(lineno) + ": framing must be 'single' " +
           "or 'delimited', got '" + j.framing + "'");
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// ---------------------------------------------------------------------------
// Message data
// ---------------------------------------------------------------------------

// One contiguous file buffer and the [offset, offset+size) span of each
// message in it (one span for `single`, one per record for `delimited`).
struct Corpus {
  std::string data;
  struct Span {
    size_t offset;
    int size;
  };
  std::vector<Span> spans;
  size_t max_size = 0;
  size_t total_bytes = 0;

  const uint8_t* ptr(const Span& s) const {
    return reinterpret_cast<const uint8_t*>(data.data()) + s.offset;
  }
};

Corpus LoadCorpus(const Job& job) {
  Corpus c;
  c.data = ReadFile(job.path);
  auto add = [&](size_t off, uint64_t len) {
    if (len > static_cast<uint64_t>(INT32_MAX)) Fail(job.path + ": message too large");
    c.spans.push_back({off, static_cast<int>(len)});
    c.max_size = std::max<size_t>(c.max_size, len);
    c.total_bytes += len;
  };
  if (job.framing == "single") {
    add(0, c.data.size());
    return c;
  }
  // delimited: base-128 varint length prefix before every message.
  size_t pos = 0;
  const size_t n = c.data.size();
  while (pos < n) {
    uint64_t len = 0;
    int shift = 0;
    for (;;) {
      if (pos >= n || shift > 63) Fail(job.path + ": truncated or bad length prefix");
      uint8_t b = static_cast<uint8_t>(c.data[pos++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    if (len > n - pos) Fail(job.path + ": delimited message runs past end of file");
    add(pos, len);
    pos += len;
  }
  if (c.spans.empty()) Fail(job.path + ": no messages");
  return c;
}

// ---------------------------------------------------------------------------
// Verification (once per job, before any timing)
// ---------------------------------------------------------------------------

bool HasMapField(const pb::Descriptor* d, std::set<const pb::Descriptor*>& seen) {
  if (!seen.insert(d).second) return false;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_map()) return true;
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
        HasMapField(f->message_type(), seen)) {
      return true;
    }
  }
  return false;
}

std::string SerializeDeterministic(const pb::Message& m) {
  std::string out;
  {
    pb::io::StringOutputStream sos(&out);
    pb::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    if (!m.SerializeToCodedStream(&cos)) Fail("serialization failed");
  }  // CodedOutputStream trims `out` to the written size on destruction.
  return out;
}

bool SameFieldSet(const pb::Descriptor* d, const pb::UnknownFieldSet& a,
                  const pb::UnknownFieldSet& b);

// True if the encodings `a` and `b` of a message of type `d` are equal except
// for the order of entries within map fields (at any depth). Decoded
// schema-free as UnknownFieldSets, so the comparison is of the wire bytes
// themselves: same fields in the same order, same values, and for each run of
// map entries the same entries, paired after sorting. (With unique keys, which
// a canonical encoding has, sorting raw entries orders them by key.)
bool SameModuloMapOrder(const pb::Descriptor* d, const std::string& a,
                        const std::string& b) {
  if (a == b) return true;
  pb::UnknownFieldSet ua, ub;
  return ua.ParseFromString(a) && ub.ParseFromString(b) && SameFieldSet(d, ua, ub);
}

bool SameFieldSet(const pb::Descriptor* d, const pb::UnknownFieldSet& a,
                  const pb::UnknownFieldSet& b) {
  const int n = a.field_count();
  if (n != b.field_count()) return false;
  int i = 0;
  while (i < n) {
    const pb::UnknownField& fa = a.field(i);
    const pb::UnknownField& fb = b.field(i);
    if (fa.number() != fb.number() || fa.type() != fb.type()) return false;
    const pb::FieldDescriptor* fd = d ? d->FindFieldByNumber(fa.number()) : nullptr;
    const bool delimited = fa.type() == pb::UnknownField::TYPE_LENGTH_DELIMITED;
    if (fd && delimited && fd->is_map()) {
      // The run of consecutive entries of this map field, on both sides.
      std::vector<std::string> ea, eb;
      int j = i;
      for (; j < n && a.field(j).number() == fa.number(); ++j) {
        const pb::UnknownField& x = a.field(j);
        const pb::UnknownField& y = b.field(j);
        if (y.number() != fa.number() ||
            x.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED ||
            y.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) {
          return false;
        }
        ea.push_back(x.length_delimited());
        eb.push_back(y.length_delimited());
      }
      if (j < n && b.field(j).number() == fa.number()) return false;
      std::sort(ea.begin(), ea.end());
      std::sort(eb.begin(), eb.end());
      for (size_t k = 0; k < ea.size(); ++k) {
        if (!SameModuloMapOrder(fd->message_type(), ea[k], eb[k])) return false;
      }
      i = j;
      continue;
    }
    bool same = false;
    switch (fa.type()) {
      case pb::UnknownField::TYPE_VARINT: same = fa.varint() == fb.varint(); break;
      case pb::UnknownField::TYPE_FIXED32: same = fa.fixed32() == fb.fixed32(); break;
      case pb::UnknownField::TYPE_FIXED64: same = fa.fixed64() == fb.fixed64(); break;
      case pb::UnknownField::TYPE_LENGTH_DELIMITED:
        same = fd && fd->type() == pb::FieldDescriptor::TYPE_MESSAGE
                   ? SameModuloMapOrder(fd->message_type(), fa.length_delimited(),
                                        fb.length_delimited())
                   : fa.length_delimited() == fb.length_delimited();
        break;
      case pb::UnknownField::TYPE_GROUP:
        same = SameFieldSet(fd && fd->type() == pb::FieldDescriptor::TYPE_GROUP
                                ? fd->message_type()
                                : nullptr,
                            fa.group(), fb.group());
        break;
    }
    if (!same) return false;
    ++i;
  }
  return true;
}

// Checks `got` (an encoding of a message parsed from `want`) against the
// input: byte-exact, or, if the type has map fields, equal up to map order.
// Returns true if it matched only modulo map order.
bool CheckRoundTrip(const Job& job, size_t index, const std::string& want,
                    const std::string& got, const pb::Descriptor* desc,
                    bool has_maps, const char* what) {
  if (got == want) return false;
  std::string where = job.path + " (" + job.type + ", message #" +
                      std::to_string(index) + ", " + what + ")";
  if (!has_maps || got.size() != want.size()) {
    Fail(where + ": round trip differs from input: " +
         std::to_string(got.size()) + " bytes vs " + std::to_string(want.size()));
  }
  if (!SameModuloMapOrder(desc, want, got)) {
    Fail(where + ": round trip differs from input by more than map order");
  }
  return true;
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

// Runs `pass` (one pass over all of the job's messages) `iters` times and
// returns the elapsed nanoseconds.
template <class Pass>
double TimePasses(Pass& pass, uint64_t iters) {
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) pass();
  auto t1 = Clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

// Warm-up + calibration + samples, per bench/README.md. Warm-up runs batches
// of passes, doubling the batch size but never overshooting, until about four
// samples' worth of time has elapsed; the time per pass is taken from the
// longest warm-up batch (the least noisy one). Each sample then runs a fixed
// number of passes, calibrated to last at least min_time_ms. Returns the
// median over samples of ns per message.
template <class Pass>
double Measure(Pass& pass, size_t msgs_per_pass, const Options& opt) {
  const double min_ns = static_cast<double>(opt.min_time_ms) * 1e6;
  const double warm_ns = 4 * min_ns;
  double warm_total = 0, longest_ns = 0, per_pass = 0;
  uint64_t batch = 1;
  for (;;) {
    const double t = TimePasses(pass, batch);
    warm_total += t;
    if (t >= longest_ns) {
      longest_ns = t;
      per_pass = t / static_cast<double>(batch);
    }
    if (warm_total >= warm_ns) break;
    const double remaining = (warm_ns - warm_total) / std::max(per_pass, 1.0);
    batch = std::min<uint64_t>(2 * batch, static_cast<uint64_t>(std::ceil(remaining)));
    if (batch < 1) batch = 1;
  }
  // 5% headroom so a sample does not fall just short of min_ns.
  uint64_t iters = static_cast<uint64_t>(std::ceil(1.05 * min_ns / std::max(per_pass, 1.0)));
  if (iters < 1) iters = 1;

  std::vector<double> ns_per_msg;
  ns_per_msg.reserve(opt.samples);
  const double msgs = static_cast<double>(iters) * static_cast<double>(msgs_per_pass);
  for (uint64_t s = 0; s < opt.samples; ++s) {
    ns_per_msg.push_back(TimePasses(pass, iters) / msgs);
  }
  std::sort(ns_per_msg.begin(), ns_per_msg.end());
  const size_t k = ns_per_msg.size();
  return k % 2 ? ns_per_msg[k / 2] : (ns_per_msg[k / 2 - 1] + ns_per_msg[k / 2]) / 2;
}

// ---------------------------------------------------------------------------
// One job
// ---------------------------------------------------------------------------

// Initial arena block size for a job: the smallest power of two (>= 4 KiB)
// into which every message of the job parses without the arena allocating
// any further block.
size_t SizeArenaBlock(const Corpus& c, const pb::Message& prototype) {
  size_t size = 4096;
  for (;;) {
    std::unique_ptr<char[]> block(new char[size]);
    bool fits = true;
    for (const auto& s : c.spans) {
      pb::Arena arena(block.get(), size);
      pb::Message* m = prototype.New(&arena);
      if (!m->ParseFromArray(c.ptr(s), s.size)) Fail("arena parse failed");
      if (arena.SpaceAllocated() > size) {
        fits = false;
        break;
      }
    }
    if (fits) return size;
    if (size >= (size_t{1} << 34)) Fail("arena block sizing did not converge");
    size *= 2;
  }
}

void RunJob(const Job& job, const Options& opt) {
  const pb::Descriptor* desc =
      pb::DescriptorPool::generated_pool()->FindMessageTypeByName(job.type);
  if (desc == nullptr) {
    Fail("line " + std::to_string(job.line) + ": type '" + job.type +
         "' is not in schema " + PP_SCHEMA_KEY);
  }
  const pb::Message* prototype =
      pb::MessageFactory::generated_factory()->GetPrototype(desc);
  if (prototype == nullptr) Fail("no generated prototype for " + job.type);

  const Corpus c = LoadCorpus(job);
  const size_t n = c.spans.size();
  std::set<const pb::Descriptor*> seen;
  const bool has_maps = HasMapField(desc, seen);

  // --- Verification and setup -------------------------------------------
  // Parse every message on the heap (also the encode op's inputs), check
  // that deterministic re-serialization reproduces it, the arena path gives
  // the same message, and the timed encode path reproduces the input.
  std::vector<std::unique_ptr<pb::Message>> parsed;
  parsed.reserve(n);
  std::vector<uint8_t> out_buf(c.max_size + 16);
  bool map_order_noted = false;
  size_t arena_block_size = 0;
  bool want_arena = std::find(opt.ops.begin(), opt.ops.end(), "decode_arena") != opt.ops.end();
  {
    pb::Arena arena;
    for (size_t i = 0; i < n; ++i) {
      const auto& s = c.spans[i];
      const std::string input(reinterpret_cast<const char*>(c.ptr(s)), s.size);
      std::unique_ptr<pb::Message> m(prototype->New());
      if (!m->ParseFromArray(c.ptr(s), s.size)) {
        Fail(job.path + ": message #" + std::to_string(i) + " does not parse as " +
             job.type);
      }
      const std::string det = SerializeDeterministic(*m);
      map_order_noted |= CheckRoundTrip(job, i, input, det, desc, has_maps,
                                        "parse + deterministic serialize");

      pb::Message* am = prototype->New(&arena);
      if (!am->ParseFromArray(c.ptr(s), s.size)) Fail(job.path + ": arena parse failed");
      if (SerializeDeterministic(*am) != det) Fail(job.path + ": arena parse differs");
      arena.Reset();

      const size_t size = m->ByteSizeLong();
      if (size > c.max_size) Fail(job.path + ": encoded size exceeds input size");
      uint8_t* end = m->SerializeWithCachedSizesToArray(out_buf.data());
      const std::string enc(reinterpret_cast<const char*>(out_buf.data()),
                            static_cast<size_t>(end - out_buf.data()));
      if (enc.size() != size) Fail(job.path + ": serialized size != ByteSizeLong()");
      map_order_noted |= CheckRoundTrip(job, i, input, enc, desc, has_maps,
                                        "encode op output");
      parsed.push_back(std::move(m));
    }
    if (want_arena) arena_block_size = SizeArenaBlock(c, *prototype);
  }
  if (map_order_noted) {
    std::fprintf(stderr,
                 "pp-cpp-worker: note: %s %s %s: C++ map order differs from the "
                 "input; accepted: same length, same bytes up to map-entry order\n",
                 job.dataset.c_str(), job.bench.c_str(), job.message.c_str());
  }

  // --- JSON forms -----------------------------------------------------------
  // Each message's JSON as the library prints it, checked to parse back to
  // the same message. A message the library cannot print or read back
  // leaves the JSON ops of the job out (noted).
  std::vector<std::string> jsons;
  bool json_ok = false;
  const bool want_json =
      std::find(opt.ops.begin(), opt.ops.end(), "json_decode") != opt.ops.end() ||
      std::find(opt.ops.begin(), opt.ops.end(), "json_encode") != opt.ops.end();
  if (want_json) {
    json_ok = true;
    for (size_t i = 0; i < n && json_ok; ++i) {
      std::string j;
      std::unique_ptr<pb::Message> back(prototype->New());
      if (!pb::util::MessageToJsonString(*parsed[i], &j).ok() ||
          !pb::util::JsonStringToMessage(j, back.get()).ok()) {
        std::fprintf(stderr, "pp-cpp-worker: note: %s %s: message #%zu has no JSON round "
                     "trip in this library: no JSON rows\n", job.bench.c_str(),
                     job.message.c_str(), i);
        json_ok = false;
      } else if (SerializeDeterministic(*back) != SerializeDeterministic(*parsed[i])) {
        std::fprintf(stderr, "pp-cpp-worker: note: %s %s: message #%zu reads back from its "
                     "JSON as another message: no JSON rows\n", job.bench.c_str(),
                     job.message.c_str(), i);
        json_ok = false;
      }
      jsons.push_back(std::move(j));
    }
  }

  // --- Timed ops ----------------------------------------------------------
  for (const std::string& op : opt.ops) {
    double ns = 0;
    if ((op == "json_decode" || op == "json_encode") && !json_ok) continue;
    if (op == "decode_owned") {
      auto pass = [&] {
        for (const auto& s : c.spans) {
          pb::Message* m = prototype->New();
          if (!m->ParseFromArray(c.ptr(s), s.size)) std::abort();
          DoNotOptimize(m);
          delete m;
        }
      };
      ns = Measure(pass, n, opt);
    } else if (op == "decode_reuse") {
      std::unique_ptr<pb::Message> m(prototype->New());
      pb::Message* mp = m.get();
      auto pass = [&] {
        for (const auto& s : c.spans) {
          // ParseFromArray clears the message first, keeping its allocations.
          if (!mp->ParseFromArray(c.ptr(s), s.size)) std::abort();
          DoNotOptimize(mp);
        }
      };
      ns = Measure(pass, n, opt);
    } else if (op == "decode_arena") {
      std::unique_ptr<char[]> block(new char[arena_block_size]);
      pb::Arena arena(block.get(), arena_block_size);
      auto pass = [&] {
        for (const auto& s : c.spans) {
          pb::Message* m = prototype->New(&arena);
          if (!m->ParseFromArray(c.ptr(s), s.size)) std::abort();
          DoNotOptimize(m);
          arena.Reset();
        }
      };
      ns = Measure(pass, n, opt);
    } else if (op == "json_decode") {
      std::unique_ptr<pb::Message> m(prototype->New());
      pb::Message* mp = m.get();
      auto pass = [&] {
        for (const auto& j : jsons) {
          if (!pb::util::JsonStringToMessage(j, mp).ok()) std::abort();
          DoNotOptimize(mp);
        }
      };
      ns = Measure(pass, n, opt);
    } else if (op == "json_encode") {
      std::string out;
      auto pass = [&] {
        for (const auto& m : parsed) {
          out.clear();
          if (!pb::util::MessageToJsonString(*m, &out).ok()) std::abort();
          DoNotOptimize(out.data());
        }
      };
      ns = Measure(pass, n, opt);
    } else if (op == "encode") {
      uint8_t* buf = out_buf.data();
      const size_t cap = out_buf.size();
      auto pass = [&] {
        for (const auto& m : parsed) {
          const size_t size = m->ByteSizeLong();
          if (size > cap) std::abort();  // never taken: checked above
          uint8_t* end = m->SerializeWithCachedSizesToArray(buf);
          DoNotOptimize(end);
        }
      };
      ns = Measure(pass, n, opt);
    }
    char bytes[64];
    if (job.framing == "single") {
      std::snprintf(bytes, sizeof bytes, "%zu", c.total_bytes);
    } else {
      std::snprintf(bytes, sizeof bytes, "%.1f",
                    static_cast<double>(c.total_bytes) / static_cast<double>(n));
    }
    std::printf("cpp,%s,%s,%s,%s,%s,%.1f\n", op.c_str(), job.dataset.c_str(),
                job.bench.c_str(), job.message.c_str(), bytes, ns);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  const Options opt = ParseArgs(argc, argv);
  const std::vector<Job> jobs = ReadJobs(opt.jobs_path);
  size_t ran = 0;
  for (const Job& job : jobs) {
    if (job.schema != PP_SCHEMA_KEY) continue;  // another worker's schema
    RunJob(job, opt);
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "pp-cpp-worker: note: no job for schema %s\n", PP_SCHEMA_KEY);
  }
  google::protobuf::ShutdownProtobufLibrary();
  return 0;
}
