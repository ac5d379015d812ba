// A static HTTP server for the real node's own tests (dev/builds/images.py builds it into a one-layer
// image): it answers every request with the pod's hostname, so a test can tell which pod a
// Service sent it to, and serves /healthz for probes. `echo-server -listen :8080`.
//
// Installed as `vllm` (the vLLM stub image, localhost/epd-vllm-stub:dev), it takes a vLLM tier's
// command line (`vllm serve MODEL --port N ...`), ignores all but the port and answers there, so a
// vLLM tier's readiness probe and the router's health checks pass on a node without vLLM.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// vllmListen is the address a `vllm serve ... --port N` command line asks for (vLLM's default port
// without --port).
func vllmListen(args []string) string {
	port := "8000"
	for i, arg := range args {
		if arg == "--port" && i+1 < len(args) {
			port = args[i+1]
		} else if strings.HasPrefix(arg, "--port=") {
			port = strings.TrimPrefix(arg, "--port=")
		}
	}
	return ":" + port
}

func main() {
	var listen string
	if filepath.Base(os.Args[0]) == "vllm" {
		listen = vllmListen(os.Args[1:])
	} else {
		flag.StringVar(&listen, "listen", ":8080", "address to serve on")
		flag.Parse()
	}
	hostname, _ := os.Hostname()
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"hostname": hostname, "path": r.URL.Path, "remote": r.RemoteAddr})
	})
	log.Printf("echo-server %s listening on %s", hostname, listen)
	log.Fatal(http.ListenAndServe(listen, nil))
}
