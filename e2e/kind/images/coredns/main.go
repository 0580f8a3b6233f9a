// CoreDNS with only the plugins kubeadm's Corefile uses (errors, health, ready, kubernetes,
// prometheus, forward, cache, loop, reload, loadbalance): the upstream binary compiles in every
// plugin (cloud DNS providers and their SDKs), which triples the build for nothing used here.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The order plugins run in, as in CoreDNS's plugin.cfg, limited to the ones compiled in.
var directives = []string{
	"reload", "health", "ready", "prometheus", "errors", "log", "loadbalance", "cache",
	"loop", "kubernetes", "forward",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
