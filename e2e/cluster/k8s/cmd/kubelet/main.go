// Package main is kube's kubelet, built by e2e/cluster/build.sh from the k8s.io/kubernetes module
// (cmd/kubelet/app) at the version the generated go.mod pins. Mirrors upstream's cmd/kubelet main.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
