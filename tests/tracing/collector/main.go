// A minimal OpenTelemetry Collector for the distributed-tracing test,
// assembled from the official modules as the collector builder (ocb)
// would generate it: the OTLP receiver (gRPC and HTTP), contrib's file
// exporter (OTLP JSON, one export request a line) and the debug exporter.
// Configuration comes from files (--config FILE), with ${env:NAME}
// references resolved. config.yaml beside this file is the test's.
//
// usage: otelcol-tracing --config config.yaml
package main

import (
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/otelcol"
)

func main() {
	info := component.BuildInfo{
		Command:     "otelcol-tracing",
		Description: "OpenTelemetry Collector for protoplane's tracing test",
		Version:     "0.161.0",
	}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
				},
				DefaultScheme: "env",
			},
		},
		ProviderModules: map[string]string{
			"env":  "go.opentelemetry.io/collector/confmap/provider/envprovider v1.67.0",
			"file": "go.opentelemetry.io/collector/confmap/provider/fileprovider v1.67.0",
		},
	}
	cmd := otelcol.NewCommand(set)
	if err := cmd.Execute(); err != nil {
		log.Fatalf("collector server run finished with error: %v", err)
	}
}
