// Command kpng-json prints the state of the services of one
// service-proxy-name as JSON, one object per service, each time it changes.
// It is the complete backend from kpng's blog post.
package main

import (
	"encoding/json"
	"os"

	"sigs.k8s.io/kpng/client"
)

func main() {
	client.Run(jsonPrint)
}

func jsonPrint(items []*client.ServiceEndpoints) {
	enc := json.NewEncoder(os.Stdout)
	for _, item := range items {
		_ = enc.Encode(item)
	}
}
