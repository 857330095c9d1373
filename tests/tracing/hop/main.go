// A grpc-go hop for the distributed-tracing test: a transparent gRPC
// forwarding proxy instrumented with OpenTelemetry (otelgrpc). Every call,
// whatever its method, is taken by an unknown-service handler and
// forwarded to the upstream server as raw message frames; the hop records
// a server span for the incoming call and a client span, its child, for
// the upstream call, whose W3C traceparent otelgrpc sends upstream.
// Unary and streaming calls are forwarded alike, with request metadata,
// response headers, trailers and the final status; message sizes are left
// for the two ends to limit. Messages are not compressed again: a
// compressed message is forwarded uncompressed. Spans are exported over
// OTLP/gRPC in batches (200 ms timeout).
//
// usage: hop --upstream HOST:PORT --otlp HOST:PORT [--listen HOST:PORT]
//
//	[--service-name NAME]
//	prints "listening on HOST:PORT", then serves until SIGTERM or SIGINT,
//	when it stops gracefully, flushes its spans and exits 0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// frame is one gRPC message, kept as its wire bytes.
type frame struct{ b []byte }

// rawCodec passes message bytes through unchanged. Its name is the
// content-subtype sent upstream (application/grpc+proto).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	// data is freed when Unmarshal returns: keep a copy.
	f.b = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// dropped are request headers not copied upstream: HTTP/2 connection and
// hop-by-hop headers, those grpc-go sets itself, and the trace context,
// which otelgrpc sets from the client span.
var dropped = map[string]bool{
	"connection":        true,
	"keep-alive":        true,
	"proxy-connection":  true,
	"transfer-encoding": true,
	"upgrade":           true,
	"te":                true,
	"host":              true,
	"content-type":      true,
	"user-agent":        true,
	"grpc-timeout":      true,
	"grpc-encoding":     true,
	"traceparent":       true,
	"tracestate":        true,
}

func outgoing(in metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range in {
		if strings.HasPrefix(k, ":") || dropped[k] {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

type hop struct{ upstream *grpc.ClientConn }

var bothWays = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// forward relays one call. The upstream call is opened on the incoming
// call's context, so it carries its deadline and its server span.
func (h *hop) forward(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "hop: no method on the stream")
	}
	in, _ := metadata.FromIncomingContext(ss.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ss.Context(), outgoing(in)))
	defer cancel()
	cs, err := h.upstream.NewStream(ctx, bothWays, method)
	if err != nil {
		return err
	}

	// Requests: downstream to upstream. An error is the downstream's
	// (the call was cancelled) unless it is a send error, whose cause
	// RecvMsg on the upstream stream reports.
	type result struct {
		err        error
		downstream bool
	}
	requests := make(chan result, 1)
	go func() {
		for {
			f := &frame{}
			if err := ss.RecvMsg(f); err != nil {
				if err == io.EOF {
					cs.CloseSend()
					requests <- result{nil, false}
				} else {
					requests <- result{err, true}
				}
				return
			}
			if err := cs.SendMsg(f); err != nil {
				requests <- result{nil, false}
				return
			}
		}
	}()

	// Responses: upstream to downstream, headers before the first message.
	responses := make(chan result, 1)
	headerSent := false
	sendHeader := func() error {
		if headerSent {
			return nil
		}
		headerSent = true
		md, err := cs.Header()
		if err != nil || len(md) == 0 {
			return nil
		}
		return ss.SendHeader(md)
	}
	go func() {
		for {
			f := &frame{}
			if err := cs.RecvMsg(f); err != nil {
				responses <- result{err, false}
				return
			}
			if err := sendHeader(); err != nil {
				responses <- result{err, true}
				return
			}
			if err := ss.SendMsg(f); err != nil {
				responses <- result{err, true}
				return
			}
		}
	}()

	for {
		select {
		case r := <-requests:
			if r.downstream {
				return r.err
			}
			requests = nil // request side done; wait for the upstream's end
		case r := <-responses:
			if r.downstream {
				return r.err
			}
			// The upstream call ended: its headers (if no message carried
			// them), trailers and status go downstream.
			_ = sendHeader()
			ss.SetTrailer(cs.Trailer())
			if r.err == io.EOF {
				return nil
			}
			return r.err
		}
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on, HOST:PORT (port 0: pick one)")
	upstream := flag.String("upstream", "", "the server calls go to, HOST:PORT (plaintext HTTP/2)")
	otlp := flag.String("otlp", "", "the OTLP/gRPC endpoint spans go to, HOST:PORT (insecure)")
	serviceName := flag.String("service-name", "grpc-go-hop", "OpenTelemetry resource service.name")
	flag.Parse()
	if *upstream == "" || *otlp == "" {
		fmt.Fprintln(os.Stderr, "usage: hop --upstream HOST:PORT --otlp HOST:PORT [--listen HOST:PORT] [--service-name NAME]")
		os.Exit(2)
	}
	log.SetFlags(0)
	log.SetPrefix("hop: ")

	ctx := context.Background()
	exporter, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(*otlp), otlptracegrpc.WithInsecure())
	if err != nil {
		log.Fatalf("otlp exporter: %v", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", *serviceName)))
	if err != nil {
		log.Fatalf("resource: %v", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(200*time.Millisecond)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	conn, err := grpc.NewClient(*upstream,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		log.Fatalf("upstream %s: %v", *upstream, err)
	}
	h := &hop{upstream: conn}
	srv := grpc.NewServer(
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.MaxRecvMsgSize(math.MaxInt32),
		grpc.UnknownServiceHandler(h.forward))

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen %s: %v", *listen, err)
	}
	fmt.Printf("listening on %s\n", lis.Addr())

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-signals:
	case err := <-served:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Fatalf("serve: %v", err)
		}
	}

	// Calls in flight get 5 s to finish.
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	conn.Close()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := tp.Shutdown(sctx); err != nil {
		log.Printf("flushing spans: %v", err)
	}
}
