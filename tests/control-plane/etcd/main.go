// etcd for the koord-bundle test environment: the upstream server
// (go.etcd.io/etcd/server/v3/etcdmain) at the version kube-apiserver's own
// module requires, so both come from one module graph and one build cache.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
