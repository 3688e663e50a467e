// Program otelcol-traces is the OTLP trace receiver of the end-to-end trace
// tests: an OpenTelemetry Collector with only the OTLP receiver and the file
// exporter, which writes what it receives as OTLP JSON lines. It is what the
// collector's builder would generate for those two components, written by
// hand so that the build needs no builder and go.sum pins every module.
package main

import (
	"context"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
)

// version is set at build time from versions.env.
var version = "dev"

func components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{
		// The collector's own telemetry is a JSON logger on stderr and
		// nothing else. The builder's default (otelconftelemetry) would also
		// compile every resource detector (AWS, GCP, Azure, Kubernetes
		// clients) and more than double the cold build.
		Telemetry: telemetry.NewFactory(
			func() component.Config { return &struct{}{} },
			telemetry.WithCreateLogger(func(context.Context, telemetry.LoggerSettings, component.Config) (*zap.Logger, component.ShutdownFunc, error) {
				logger, err := zap.NewProduction()
				return logger, nil, err
			}),
		),
	}
	factories.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	factories.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	return factories, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-traces",
			Description: "OTLP receiver writing OTLP JSON lines to a file",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// The builder's defaults: `--config=<path>` is a file, and
				// `${NAME}` in it an environment variable.
				ProviderFactories: []confmap.ProviderFactory{envprovider.NewFactory(), fileprovider.NewFactory()},
				DefaultScheme:     "env",
			},
		},
	}
	// Cobra has already printed the error.
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		os.Exit(1)
	}
}
