// Command controlplane is an xDS management server for integration tests.
//
// It serves the state-of-the-world ADS service on 127.0.0.1 from a
// SnapshotCache (responses on the one ADS stream). Every node maps to the same cache key, so all
// clients see the same snapshot. Snapshots arrive as JSON lines on stdin; each
// line replaces the whole snapshot. Events are logged to stdout, one line each.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// nodeKey is the single cache key that every node is mapped to.
const nodeKey = "all"

// sameHash maps every node to nodeKey.
type sameHash struct{}

func (sameHash) ID(*core.Node) string { return nodeKey }

// outMu serialises writes to stdout so that lines from concurrent streams do
// not interleave. os.Stdout is unbuffered, so each line is written (flushed)
// immediately.
var outMu sync.Mutex

func emit(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	line = strings.ReplaceAll(line, "\n", " ") + "\n"
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = io.WriteString(os.Stdout, line)
}

// ---- JSON snapshot schema ----

type snapshotSpec struct {
	Version   string         `json:"version"`
	Listeners []listenerSpec `json:"listeners"`
	Routes    []routeSpec    `json:"routes"`
	Clusters  []clusterSpec  `json:"clusters"`
	Endpoints []endpointSpec `json:"endpoints"`
}

type listenerSpec struct {
	Name        string `json:"name"`
	RouteConfig string `json:"route_config"`
	Inline      bool   `json:"inline"`
}

type routeSpec struct {
	Name    string      `json:"name"`
	Domains []string    `json:"domains"`
	Routes  []routeItem `json:"routes"`
}

type routeItem struct {
	Prefix           *string        `json:"prefix"`
	Path             *string        `json:"path"`
	Headers          []headerSpec   `json:"headers"`
	Cluster          string         `json:"cluster"`
	WeightedClusters []weightedSpec `json:"weighted_clusters"`
	TimeoutMs        *int64         `json:"timeout_ms"`
	Retry            *retrySpec     `json:"retry"`
}

type headerSpec struct {
	Name    string  `json:"name"`
	Exact   *string `json:"exact"`
	Present bool    `json:"present"`
}

type weightedSpec struct {
	Name   string `json:"name"`
	Weight uint32 `json:"weight"`
}

type retrySpec struct {
	NumRetries uint32 `json:"num_retries"`
	RetryOn    string `json:"retry_on"`
}

type clusterSpec struct {
	Name           string `json:"name"`
	EdsServiceName string `json:"eds_service_name"`
	Type           string `json:"type"`
	// DNS is a LOGICAL_DNS cluster's "host:port".
	DNS string `json:"dns"`
}

type endpointSpec struct {
	Cluster    string         `json:"cluster"`
	Localities []localitySpec `json:"localities"`
}

type localitySpec struct {
	Region    string       `json:"region"`
	Zone      string       `json:"zone"`
	SubZone   string       `json:"sub_zone"`
	Weight    *uint32      `json:"weight"`
	Priority  uint32       `json:"priority"`
	Endpoints []lbEndpoint `json:"endpoints"`
}

type lbEndpoint struct {
	Address string `json:"address"`
	Port    uint32 `json:"port"`
	Weight  uint32 `json:"weight"`
	Health  string `json:"health"`
}

// ---- conversion to xDS resources ----

func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		ResourceApiVersion:    core.ApiVersion_V3,
	}
}

func buildListener(l listenerSpec, routes map[string]*route.RouteConfiguration) (*listener.Listener, error) {
	if l.Name == "" {
		return nil, errors.New("listener without name")
	}
	routerAny, err := anypb.New(&router.Router{})
	if err != nil {
		return nil, err
	}
	manager := &hcm.HttpConnectionManager{
		StatPrefix: l.Name,
		HttpFilters: []*hcm.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: routerAny},
		}},
	}
	if l.Inline {
		rc, ok := routes[l.RouteConfig]
		if !ok {
			return nil, fmt.Errorf("listener %q: inline route config %q not found in routes", l.Name, l.RouteConfig)
		}
		manager.RouteSpecifier = &hcm.HttpConnectionManager_RouteConfig{RouteConfig: rc}
	} else {
		manager.RouteSpecifier = &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: l.RouteConfig,
		}}
	}
	hcmAny, err := anypb.New(manager)
	if err != nil {
		return nil, err
	}
	return &listener.Listener{
		Name:        l.Name,
		ApiListener: &listener.ApiListener{ApiListener: hcmAny},
	}, nil
}

func buildRoute(r routeSpec) (*route.RouteConfiguration, error) {
	if r.Name == "" {
		return nil, errors.New("route config without name")
	}
	domains := r.Domains
	if len(domains) == 0 {
		domains = []string{"*"}
	}
	vh := &route.VirtualHost{Name: r.Name + "-vh", Domains: domains}
	for i, item := range r.Routes {
		rt, err := buildRouteItem(item)
		if err != nil {
			return nil, fmt.Errorf("route config %q route %d: %w", r.Name, i, err)
		}
		vh.Routes = append(vh.Routes, rt)
	}
	return &route.RouteConfiguration{Name: r.Name, VirtualHosts: []*route.VirtualHost{vh}}, nil
}

func buildRouteItem(item routeItem) (*route.Route, error) {
	match := &route.RouteMatch{}
	switch {
	case item.Prefix != nil && item.Path != nil:
		return nil, errors.New("both prefix and path set")
	case item.Prefix != nil:
		match.PathSpecifier = &route.RouteMatch_Prefix{Prefix: *item.Prefix}
	case item.Path != nil:
		match.PathSpecifier = &route.RouteMatch_Path{Path: *item.Path}
	default:
		return nil, errors.New("one of prefix or path is required")
	}
	for _, h := range item.Headers {
		if h.Name == "" {
			return nil, errors.New("header matcher without name")
		}
		hm := &route.HeaderMatcher{Name: h.Name}
		switch {
		case h.Exact != nil && h.Present:
			return nil, fmt.Errorf("header %q: both exact and present set", h.Name)
		case h.Exact != nil:
			hm.HeaderMatchSpecifier = &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
				MatchPattern: &matcher.StringMatcher_Exact{Exact: *h.Exact},
			}}
		case h.Present:
			hm.HeaderMatchSpecifier = &route.HeaderMatcher_PresentMatch{PresentMatch: true}
		default:
			return nil, fmt.Errorf("header %q: one of exact or present is required", h.Name)
		}
		match.Headers = append(match.Headers, hm)
	}

	action := &route.RouteAction{}
	switch {
	case item.Cluster != "" && len(item.WeightedClusters) > 0:
		return nil, errors.New("both cluster and weighted_clusters set")
	case item.Cluster != "":
		action.ClusterSpecifier = &route.RouteAction_Cluster{Cluster: item.Cluster}
	case len(item.WeightedClusters) > 0:
		wc := &route.WeightedCluster{}
		for _, w := range item.WeightedClusters {
			wc.Clusters = append(wc.Clusters, &route.WeightedCluster_ClusterWeight{
				Name:   w.Name,
				Weight: wrapperspb.UInt32(w.Weight),
			})
		}
		action.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: wc}
	default:
		return nil, errors.New("one of cluster or weighted_clusters is required")
	}
	if item.TimeoutMs != nil {
		action.MaxStreamDuration = &route.RouteAction_MaxStreamDuration{
			MaxStreamDuration: durationpb.New(time.Duration(*item.TimeoutMs) * time.Millisecond),
		}
	}
	if item.Retry != nil {
		action.RetryPolicy = &route.RetryPolicy{
			RetryOn:    item.Retry.RetryOn,
			NumRetries: wrapperspb.UInt32(item.Retry.NumRetries),
		}
	}
	return &route.Route{
		Match:  match,
		Action: &route.Route_Route{Route: action},
	}, nil
}

func buildCluster(c clusterSpec) (*cluster.Cluster, error) {
	if c.Name == "" {
		return nil, errors.New("cluster without name")
	}
	typeName := strings.ToUpper(c.Type)
	if typeName == "" {
		typeName = "EDS"
	}
	typeValue, ok := cluster.Cluster_DiscoveryType_value[typeName]
	if !ok {
		return nil, fmt.Errorf("cluster %q: unknown type %q", c.Name, c.Type)
	}
	if typeName == "LOGICAL_DNS" {
		host, port, err := net.SplitHostPort(c.DNS)
		if err != nil {
			return nil, fmt.Errorf("cluster %q: dns %q: %v", c.Name, c.DNS, err)
		}
		var p uint32
		if _, err := fmt.Sscanf(port, "%d", &p); err != nil {
			return nil, fmt.Errorf("cluster %q: dns port %q", c.Name, port)
		}
		addr := &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address:       host,
			PortSpecifier: &core.SocketAddress_PortValue{PortValue: p},
		}}}
		return &cluster.Cluster{
			Name:                 c.Name,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_LOGICAL_DNS},
			LoadAssignment: &endpoint.ClusterLoadAssignment{
				ClusterName: c.Name,
				Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{{
					HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: addr}},
				}}}},
			},
			LbPolicy:       cluster.Cluster_ROUND_ROBIN,
			ConnectTimeout: durationpb.New(time.Second),
		}, nil
	}
	eds := &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource()}
	if c.EdsServiceName != "" {
		eds.ServiceName = c.EdsServiceName
	}
	return &cluster.Cluster{
		Name:                 c.Name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_DiscoveryType(typeValue)},
		EdsClusterConfig:     eds,
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		ConnectTimeout:       durationpb.New(time.Second),
	}, nil
}

func buildEndpoints(e endpointSpec) (*endpoint.ClusterLoadAssignment, error) {
	if e.Cluster == "" {
		return nil, errors.New("endpoints without cluster")
	}
	cla := &endpoint.ClusterLoadAssignment{ClusterName: e.Cluster}
	for _, loc := range e.Localities {
		// An absent locality weight defaults to 1; an explicit 0 is sent as 0.
		weight := uint32(1)
		if loc.Weight != nil {
			weight = *loc.Weight
		}
		lle := &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: loc.Region, Zone: loc.Zone, SubZone: loc.SubZone},
			LoadBalancingWeight: wrapperspb.UInt32(weight),
			Priority:            loc.Priority,
		}
		for _, ep := range loc.Endpoints {
			healthName := strings.ToUpper(ep.Health)
			if healthName == "" {
				healthName = "UNKNOWN"
			}
			health, ok := core.HealthStatus_value[healthName]
			if !ok {
				return nil, fmt.Errorf("endpoints %q: unknown health %q", e.Cluster, ep.Health)
			}
			lb := &endpoint.LbEndpoint{
				HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
						Protocol:      core.SocketAddress_TCP,
						Address:       ep.Address,
						PortSpecifier: &core.SocketAddress_PortValue{PortValue: ep.Port},
					}}},
				}},
				HealthStatus: core.HealthStatus(health),
			}
			if ep.Weight > 0 {
				lb.LoadBalancingWeight = wrapperspb.UInt32(ep.Weight)
			}
			lle.LbEndpoints = append(lle.LbEndpoints, lb)
		}
		cla.Endpoints = append(cla.Endpoints, lle)
	}
	return cla, nil
}

// buildSnapshot converts one decoded JSON line into a cache snapshot.
func buildSnapshot(spec *snapshotSpec) (*cachev3.Snapshot, error) {
	if spec.Version == "" {
		return nil, errors.New("missing version")
	}
	var listeners, routes, clusters, endpoints []types.Resource
	routeByName := map[string]*route.RouteConfiguration{}
	for _, r := range spec.Routes {
		rc, err := buildRoute(r)
		if err != nil {
			return nil, err
		}
		routeByName[rc.Name] = rc
		routes = append(routes, rc)
	}
	for _, l := range spec.Listeners {
		lis, err := buildListener(l, routeByName)
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, lis)
	}
	for _, c := range spec.Clusters {
		cl, err := buildCluster(c)
		if err != nil {
			return nil, err
		}
		clusters = append(clusters, cl)
	}
	for _, e := range spec.Endpoints {
		cla, err := buildEndpoints(e)
		if err != nil {
			return nil, err
		}
		endpoints = append(endpoints, cla)
	}
	return cachev3.NewSnapshot(spec.Version, map[resource.Type][]types.Resource{
		resource.ListenerType: listeners,
		resource.RouteType:    routes,
		resource.ClusterType:  clusters,
		resource.EndpointType: endpoints,
	})
}

// checkReferences lists the dangling or unused references in a snapshot.
//
// Snapshot.Consistent only follows listeners' filter chains, not
// api_listener, so for API listeners it reports every route config as
// unreferenced and misses missing ones. It is therefore applied to the
// cluster and endpoint resources only; listener -> route config and
// route -> cluster references are checked here directly.
func checkReferences(spec *snapshotSpec, snap *cachev3.Snapshot) []string {
	var problems []string

	clusterPart, err := cachev3.NewSnapshot(spec.Version, map[resource.Type][]types.Resource{
		resource.ClusterType:  resourceItems(snap, resource.ClusterType),
		resource.EndpointType: resourceItems(snap, resource.EndpointType),
	})
	if err == nil {
		err = clusterPart.Consistent()
	}
	if err != nil {
		problems = append(problems, err.Error())
	}

	routeNames := map[string]bool{}
	for _, r := range spec.Routes {
		routeNames[r.Name] = true
	}
	referenced := map[string]bool{}
	for _, l := range spec.Listeners {
		referenced[l.RouteConfig] = true
		if !l.Inline && !routeNames[l.RouteConfig] {
			problems = append(problems, fmt.Sprintf("listener %q references missing route config %q", l.Name, l.RouteConfig))
		}
	}
	for _, r := range spec.Routes {
		if !referenced[r.Name] {
			problems = append(problems, fmt.Sprintf("route config %q is not referenced by any listener", r.Name))
		}
	}

	clusterNames := map[string]bool{}
	for _, c := range spec.Clusters {
		clusterNames[c.Name] = true
	}
	for _, r := range spec.Routes {
		reported := map[string]bool{}
		for _, item := range r.Routes {
			names := []string{item.Cluster}
			for _, w := range item.WeightedClusters {
				names = append(names, w.Name)
			}
			for _, name := range names {
				if name != "" && !clusterNames[name] && !reported[name] {
					reported[name] = true
					problems = append(problems, fmt.Sprintf("route config %q references missing cluster %q", r.Name, name))
				}
			}
		}
	}
	return problems
}

func resourceItems(snap *cachev3.Snapshot, typeURL resource.Type) []types.Resource {
	var items []types.Resource
	for _, item := range snap.GetResources(typeURL) {
		items = append(items, item)
	}
	return items
}

func parseLine(line string) (*snapshotSpec, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	spec := &snapshotSpec{}
	if err := dec.Decode(spec); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after JSON object")
	}
	return spec, nil
}

// readSnapshots installs one snapshot per stdin line until EOF.
func readSnapshots(ctx context.Context, snapshots cachev3.SnapshotCache, in io.Reader) {
	reader := bufio.NewReader(in)
	for {
		line, err := reader.ReadString('\n')
		if text := strings.TrimSpace(line); text != "" {
			applyLine(ctx, snapshots, text)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				emit("error: reading stdin: %v", err)
			}
			return
		}
	}
}

func applyLine(ctx context.Context, snapshots cachev3.SnapshotCache, text string) {
	spec, err := parseLine(text)
	if err != nil {
		emit("error: invalid snapshot JSON: %v", err)
		return
	}
	snap, err := buildSnapshot(spec)
	if err != nil {
		emit("error: %v", err)
		return
	}
	if problems := checkReferences(spec, snap); len(problems) > 0 {
		emit("warning: inconsistent snapshot: %s", strings.Join(problems, "; "))
	}
	if err := snapshots.SetSnapshot(ctx, nodeKey, snap); err != nil {
		emit("error: setting snapshot %s: %v", spec.Version, err)
		return
	}
	emit("snapshot %s set", spec.Version)
}

// ---- server callbacks ----

// sentResponse is the last response sent on a stream for one type.
type sentResponse struct {
	nonce   string
	version string
}

// streamState holds per-stream data the callbacks need: the node id (clients
// usually send the node only in the first request of a stream) and the last
// response sent for each type.
type streamState struct {
	mu    sync.Mutex
	nodes map[int64]string
	sent  map[int64]map[string]sentResponse
}

func (s *streamState) nodeFor(id int64, req *discovery.DiscoveryRequest) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := req.GetNode().GetId(); n != "" {
		s.nodes[id] = n
		return n
	}
	return s.nodes[id]
}

func (s *streamState) recordResponse(id int64, resp *discovery.DiscoveryResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent[id] == nil {
		s.sent[id] = map[string]sentResponse{}
	}
	s.sent[id][resp.GetTypeUrl()] = sentResponse{nonce: resp.GetNonce(), version: resp.GetVersionInfo()}
}

// rejectedVersion returns the version of the response a NACK refers to.
func (s *streamState) rejectedVersion(id int64, req *discovery.DiscoveryRequest) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.sent[id][req.GetTypeUrl()]
	if !ok || last.nonce != req.GetResponseNonce() {
		return "", false
	}
	return last.version, true
}

func (s *streamState) forget(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, id)
	delete(s.sent, id)
}

func callbacks() serverv3.Callbacks {
	state := &streamState{nodes: map[int64]string{}, sent: map[int64]map[string]sentResponse{}}
	return serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			emit("stream open")
			return nil
		},
		StreamClosedFunc: func(id int64, _ *core.Node) {
			state.forget(id)
			emit("stream closed")
		},
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			ack := "yes"
			detail := ""
			switch {
			case req.GetErrorDetail() != nil:
				ack = "no"
				detail = req.GetErrorDetail().GetMessage()
			case req.GetResponseNonce() == "":
				ack = "first"
			}
			emit("request node=%s type=%s version=%s nonce=%s names=%s ack=%s detail=%s",
				state.nodeFor(id, req), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(),
				strings.Join(req.GetResourceNames(), ","), ack, detail)
			// A NACK carries the last accepted version, which differs from the
			// snapshot's, so the snapshot cache would answer it at once with the
			// same rejected resources, and the client would NACK again in a
			// tight loop. Marking the request as being at the rejected version
			// makes the cache wait for the next snapshot instead.
			if req.GetErrorDetail() != nil {
				if version, ok := state.rejectedVersion(id, req); ok {
					req.VersionInfo = version
				}
			}
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			state.recordResponse(id, resp)
			emit("response type=%s version=%s nonce=%s resources=%d",
				resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
		},
	}
}

// serverTLS is the server's TLS: its certificate, and with clientCA,
// client certificates required and checked against that CA (mutual TLS).
func serverTLS(cert, key, clientCA string) (credentials.TransportCredentials, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	config := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", clientCA)
		}
		config.ClientCAs = pool
		config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(config), nil
}

func main() {
	port := flag.Int("port", 0, "TCP port on 127.0.0.1 to listen on (0 picks a free port)")
	cert := flag.String("tls-cert", "", "serve TLS with this PEM certificate chain (with --tls-key)")
	key := flag.String("tls-key", "", "the PEM private key of --tls-cert")
	clientCA := flag.String("client-ca", "", "with TLS, require client certificates signed by this PEM CA")
	flag.Parse()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Not in the cache's ADS mode: that mode answers only requests that
	// name every resource of the snapshot, and a gRPC client names only
	// the ones it needs (the cluster its route uses, not every cluster).
	// Responses still go out on the one ADS stream.
	snapshots := cachev3.NewSnapshotCache(false, sameHash{}, nil)
	xds := serverv3.NewServer(ctx, snapshots, callbacks())

	// Permissive keepalive enforcement so that clients sending frequent
	// pings are not disconnected with GOAWAY (too_many_pings).
	opts := []grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime:             time.Second,
		PermitWithoutStream: true,
	})}
	if *cert != "" {
		creds, err := serverTLS(*cert, *key, *clientCA)
		if err != nil {
			emit("error: tls: %v", err)
			os.Exit(1)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	grpcServer := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(grpcServer, xds)

	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		emit("error: listen: %v", err)
		os.Exit(1)
	}
	emit("xds listening on %s", lis.Addr().String())

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		grpcServer.Stop()
		os.Exit(0)
	}()

	go readSnapshots(ctx, snapshots, os.Stdin)

	if err := grpcServer.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		emit("error: serve: %v", err)
		os.Exit(1)
	}
	// Serve returns only after Stop, which the signal handler follows with exit 0.
	select {}
}
