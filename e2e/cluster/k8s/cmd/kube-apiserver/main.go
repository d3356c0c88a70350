// Package main is kube's kube-apiserver, built by e2e/cluster/build.sh from the k8s.io/kubernetes module
// (cmd/kube-apiserver/app) at the version the generated go.mod pins. Mirrors upstream's cmd/kube-apiserver main.
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
