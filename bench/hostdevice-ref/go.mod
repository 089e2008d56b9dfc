// Builds the reference host-device plugin of containernetworking/plugins for bench/bench_cni.py.
module nicop.local/bench/hostdevice-ref

go 1.24.2

require github.com/containernetworking/plugins v1.9.1

require golang.org/x/sys v0.35.0 // indirect
