// Package main is the node's cluster DNS: CoreDNS, built by e2e/cluster/build.sh from the
// github.com/coredns/coredns module with only the plugins a one-node test cluster's Corefile
// uses (upstream's main links every plugin, cloud back-ends included). Pods resolve
// <service>.<namespace>.svc through it, as they do through kube-dns or CoreDNS on any cluster.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins run in (upstream's plugin.cfg order, restricted to the ones linked).
var directives = []string{"errors", "health", "ready", "kubernetes", "cache", "loadbalance"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
