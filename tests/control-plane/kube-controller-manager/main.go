// kube-controller-manager for the koord-bundle test environment: the upstream
// command (k8s.io/kubernetes/cmd/kube-controller-manager). It runs the
// namespace controller (a deleted namespace goes away), the garbage collector,
// the service-account controllers and the workload controllers (Deployments
// make ReplicaSets and Pods), as on a real cluster.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
