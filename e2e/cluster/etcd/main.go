// Package main is etcd, built by e2e/cluster/build.sh from the go.etcd.io/etcd/server/v3 module at
// the version the generated go.mod pins (the root module's main does exactly this).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
