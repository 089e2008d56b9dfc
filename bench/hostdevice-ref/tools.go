//go:build tools

// Package tools pins the reference plugin module; bench/bench_cni.py builds
// github.com/containernetworking/plugins/plugins/main/host-device from it.
package tools

import _ "github.com/containernetworking/plugins/pkg/ns"
