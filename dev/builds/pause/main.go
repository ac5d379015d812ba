// The pod sandbox's pause process for the local real node (the image kubelet and containerd call
// the sandbox image): it holds the pod's namespaces, reaps orphans when it is PID 1 of a shared
// process namespace, and exits on SIGINT or SIGTERM. Built locally because no registry serves
// registry.k8s.io/pause here; it does what Kubernetes' build/pause/linux/pause.c does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
