// grpc-go's client against a protoplane server's connection lifecycle
// (gRFC A9): calls keep succeeding while the server's maximum connection
// age moves the client from connection to connection, and a connection
// the server closes for idleness sends the channel to IDLE, from which
// the next call dials again. Calls go to the standard health service.
//
// usage: keepalive-client -addr HOST:PORT -mode age|idle [-seconds S]
// Prints one line: "ok N failed N connections N state-after-idle S".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
	flag.Parse()
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
