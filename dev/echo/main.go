// A static HTTP server for the real node's own tests (dev/images.py builds it into a one-layer
// image): it answers every request with the pod's hostname, so a test can tell which pod a
// Service sent it to, and serves /healthz for probes. `echo-server -listen :8080`.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"os"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	flag.Parse()
	hostname, _ := os.Hostname()
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"hostname": hostname, "path": r.URL.Path, "remote": r.RemoteAddr})
	})
	log.Printf("echo-server %s listening on %s", hostname, *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
