// The OCI registry of the kind suite: CNCF Distribution's own server command (registry.RootCmd,
// `registry serve config.yml`), linked with the one storage driver a registry on this machine
// needs (filesystem). cmd/registry also links the S3, GCS and Azure drivers and the pull-through
// proxy, which would triple the build for nothing used here.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
