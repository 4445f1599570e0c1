// A CoreDNS with only the plugins the local real-pods cluster needs: cluster.local from the
// API server (kubernetes), the address to listen on (bind), health and readiness endpoints,
// errors, a cache. Nothing that
// forwards to the outside: the cluster's network namespace has no route out.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which the plugins handle a query (CoreDNS's own order for these).
var directives = []string{"bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
