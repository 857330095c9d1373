// Command xdsclient is grpc-go's own xDS client, used by tests/xds/run.sh
// as the reference for protoplane's: it dials an xds:/// target (the
// bootstrap comes from GRPC_XDS_BOOTSTRAP, as for any grpc-go program),
// makes unary socialnetwork.SocialNetwork/Login calls and prints one line
// "calls_made=<n> failed=<m>".
//
// No generated code: the request is sent as raw bytes through a codec that
// passes []byte through, so protoc is not needed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // registers the xds resolver and the xDS balancers
)

// rawCodec sends and receives message bytes as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" } // the content-type the server expects

// loginRequest is LoginRequest{username: "u"}: field 2, length 1, "u".
var loginRequest = []byte{0x12, 0x01, 0x75}

func main() {
	target := flag.String("target", "xds:///sn", "the target to dial")
	requests := flag.Int("requests", 4000, "number of unary calls")
	concurrency := flag.Int("concurrency", 16, "number of goroutines making calls")
	flag.Parse()

	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial %s: %v\n", *target, err)
		os.Exit(1)
	}
	defer conn.Close()

	// Each goroutine takes call numbers from next until all are taken.
	var next, made, failed atomic.Int64
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(*requests) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req, resp := loginRequest, []byte(nil)
				// WaitForReady: the first calls wait for the xDS resources
				// instead of failing while the channel is still connecting.
				err := conn.Invoke(ctx, "/socialnetwork.SocialNetwork/Login", &req, &resp,
					grpc.ForceCodec(rawCodec{}), grpc.WaitForReady(true))
				cancel()
				made.Add(1)
				if err != nil {
					if failed.Add(1) == 1 {
						fmt.Fprintf(os.Stderr, "first failed call: %v\n", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("calls_made=%d failed=%d\n", made.Load(), failed.Load())
}
