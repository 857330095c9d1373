// grpc-go against protoplane's keepalive and connection lifecycle
// (gRFC A8, A9). As a client (-mode age|idle): calls keep succeeding
// while a protoplane server's maximum connection age moves the client
// from connection to connection, and a connection the server closes for
// idleness sends the channel to IDLE, from which the next call dials
// again. As a server (-mode server): grpc-go's health service with its
// keepalive enforcement policy (-min-time, -permit-without-stream), for
// protoplane's client to ping. Calls go to the standard health service.
//
// usage: keepalive-peer -addr HOST:PORT -mode age|idle [-seconds S]
//
//	prints "ok N failed N connections N state-after-idle S"
//	keepalive-peer -mode server [-min-time D] [-permit-without-stream]
//	prints "listening on HOST:PORT", then serves until killed
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
)

// connections counts the transports the channel opened.
type connections struct{ n atomic.Int64 }

func (c *connections) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *connections) HandleRPC(context.Context, stats.RPCStats)                       {}
func (c *connections) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *connections) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		c.n.Add(1)
	}
}

func main() {
	addr := flag.String("addr", "", "the server, HOST:PORT")
	mode := flag.String("mode", "age", "age: call for -seconds; idle: call, wait -seconds, call")
	seconds := flag.Float64("seconds", 2, "how long")
	minTime := flag.Duration("min-time", 5*time.Minute, "server: keepalive.EnforcementPolicy.MinTime")
	permit := flag.Bool("permit-without-stream", false, "server: keepalive.EnforcementPolicy.PermitWithoutStream")
	flag.Parse()
	if *mode == "server" {
		serve(*minTime, *permit)
		return
	}
	counter := &connections{}
	conn, err := grpc.NewClient("passthrough:///"+*addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(counter))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ok, failed := 0, 0
	check := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			failed++
			fmt.Fprintln(os.Stderr, "call failed:", err)
		} else {
			ok++
		}
	}
	span := time.Duration(*seconds * float64(time.Second))
	state := "-"
	switch *mode {
	case "age":
		for end := time.Now().Add(span); time.Now().Before(end); {
			check()
		}
	case "idle":
		check()
		time.Sleep(span)
		state = conn.GetState().String()
		check()
	default:
		fmt.Fprintln(os.Stderr, "unknown -mode", *mode)
		os.Exit(2)
	}
	fmt.Printf("ok %d failed %d connections %d state-after-idle %s\n", ok, failed, counter.n.Load(), state)
}

// announcer prints "connection" for each connection a server accepts.
type announcer struct{}

func (announcer) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (announcer) HandleRPC(context.Context, stats.RPCStats)                         {}
func (announcer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (announcer) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		fmt.Println("connection")
	}
}

// serve runs grpc-go's health service with the keepalive enforcement
// policy given, on a free loopback port, until killed.
func serve(minTime time.Duration, permit bool) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime:             minTime,
		PermitWithoutStream: permit,
	}), grpc.StatsHandler(announcer{}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Printf("listening on %s\n", lis.Addr())
	if err := s.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
