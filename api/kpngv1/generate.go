// Package kpngv1 is the kpng controller's gRPC API (kpng.proto) and its
// conversion to and from the client model.
package kpngv1

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative kpng.proto
