# The real-pods half of `up --real` and `down --real`: a network namespace of the cluster's
# own with no route out, containerd + runc, one kubelet, kube-proxy (iptables), CoreDNS, local
# volumes on the node, and a loopback forwarder to the API server. Sourced after lib.sh.
#
# Network rule: pod and Service addresses are private-range addresses, reachable only inside
# this namespace. Every daemon of the cluster and every client that talks to pods runs under
# `nsenter --net=/run/netns/$NETNS` (not `ip netns exec`, whose private mount namespace would
# hide kubelet's tmpfs mounts from containerd). The host side sees only 127.0.0.1:$APISERVER_PORT.

NETNS="${STATEWARD_NETNS:-stateward-real}"
NETNS_PATH="/run/netns/$NETNS"
# Inside the namespace: the node's address on a veth pair whose two ends both stay inside, a
# default route into it (so Service addresses route and nothing leaves), pods on a bridge.
NODE_IP="${STATEWARD_NODE_IP:-10.250.0.2}"
POD_CIDR="${STATEWARD_POD_CIDR:-10.244.0.0/24}"
SERVICE_CIDR=10.96.0.0/16
NODE_NAME="${STATEWARD_NODE_NAME:-real-0}"
CNI_BIN_DIR=/usr/lib/cni
CNI_NETWORK="stateward-$NETNS"
# Pods' cgroups live under this root, so teardown finds every process of the cluster's pods.
CGROUP_ROOT="/$NETNS"

in_ns() { nsenter --net="$NETNS_PATH" "$@"; }

real_preflight() {
    local missing=() c
    for c in containerd containerd-shim-runc-v2 ctr runc ip nsenter iptables socat mount umount; do
        command -v "$c" >/dev/null || missing+=("$c")
    done
    [ ${#missing[@]} -eq 0 ] || die "missing commands for --real: ${missing[*]} (Debian packages: containerd runc iproute2 util-linux iptables socat; scripts/setup installs them)"
    for c in bridge host-local loopback portmap; do
        [ -x "$CNI_BIN_DIR/$c" ] || die "CNI plugin $CNI_BIN_DIR/$c missing (Debian package: containernetworking-plugins)"
    done
    for c in kubelet kube-proxy coredns pause; do
        [ -x "$(bin_path "$c")" ] || die "binary missing: $(bin_path "$c") — run tests/cluster/build first"
    done
    local img ref archive
    while read -r img ref archive; do
        [ -s "$archive" ] || die "image $ref not built ($archive) — run tests/cluster/images first"
    done < <("$CLUSTER_DIR/images" --archives)
    [ "$(id -u)" -eq 0 ] || die "--real needs root (network namespaces, mounts, containerd)"
    [ -d /proc/sys/net/bridge ] || modprobe br_netfilter 2>/dev/null ||
        die "the kernel has no br_netfilter (pods reaching Services on the same bridge need it)"
    grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
        die "the kernel has no overlay file system (containerd's snapshotter needs it)"
    if [ -e "$NETNS_PATH" ]; then
        die "network namespace $NETNS already exists and is not this cluster's; remove it (ip netns delete $NETNS) or set STATEWARD_NETNS"
    fi
}

real_netns_up() {
    ip netns add "$NETNS"
    echo "$NETNS" >"$STATE_DIR/netns"
    ip -n "$NETNS" link set lo up
    ip -n "$NETNS" link add sw-node type veth peer name sw-peer
    ip -n "$NETNS" addr add "$NODE_IP/24" dev sw-node
    ip -n "$NETNS" link set sw-node up
    ip -n "$NETNS" link set sw-peer up
    # A default route so Service addresses route (kube-proxy DNATs them after routing); its
    # far end is sw-peer, in this same namespace, where no address answers: nothing leaves.
    ip -n "$NETNS" route add default dev sw-node
    in_ns sysctl -qw net.ipv4.ip_forward=1
    in_ns sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
}

real_certs() {
    gen_cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
    gen_cert kubelet-serving "/CN=$NODE_NAME" serverAuth "IP:$NODE_IP,DNS:$NODE_NAME"
    gen_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
    gen_cert kube-proxy "/CN=system:kube-proxy" clientAuth
    gen_cert coredns "/CN=system:coredns" clientAuth
    local c
    for c in kubelet-client kube-proxy coredns; do write_kubeconfig "$PKI/$c.kubeconfig" "$c"; done
}

real_containerd_up() {
    local d="$STATE_DIR/containerd" pause_ref
    pause_ref="$("$CLUSTER_DIR/images" --archives | awk '$1 == "pause" { print $2 }')"
    mkdir -p "$d/root" "$d/state" "$STATE_DIR/cni/net.d" "$STATE_DIR/cni/ipam"
    cat >"$STATE_DIR/cni/net.d/10-stateward.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": { "type": "host-local", "dataDir": "$STATE_DIR/cni/ipam",
                "ranges": [[{ "subnet": "$POD_CIDR" }]], "routes": [{ "dst": "0.0.0.0/0" }] }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
    cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  address = "$d/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  # Root here lacks CAP_SYS_RESOURCE: sandboxes' oom_score_adj of -998 would fail runc.
  restrict_oom_score_adj = true
  # Pods' network namespaces are pinned under the state dir, so teardown finds them.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$STATE_DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
EOF
    start_cmd containerd "$(command -v containerd)" --config "$d/config.toml"
    wait_for containerd 30 ctr_ok
    real_import_images
}

# Imports every image archive not imported yet (a running cluster picks up rebuilt images), and
# again any the node no longer has: the kubelet deletes unused images when the disk runs low.
real_import_images() {
    local img ref archive present done_list="$STATE_DIR/images.imported"
    touch "$done_list"
    present=$(ctr_ -n k8s.io images ls -q 2>/dev/null || true)
    while read -r img ref archive; do
        grep -qxF "$archive" "$done_list" && grep -qxF "$ref" <<<"$present" && continue
        ctr_ -n k8s.io images import --base-name "localhost/stateward/$img" "$archive" >/dev/null ||
            fail_with_log containerd "could not import $archive"
        echo "$archive" >>"$done_list"
        say "imported $ref"
    done < <("$CLUSTER_DIR/images" --archives)
}

ctr_() { in_ns ctr --address "$STATE_DIR/containerd/containerd.sock" "$@"; }
ctr_ok() { ctr_ version >/dev/null 2>&1; }

real_kubelet_up() {
    local - # `up` runs with globbing off; this function needs it
    set +f
    local d="$STATE_DIR/kubelet" ctl
    mkdir -p "$d/root" "$d/volume-plugins" "$d/pki" "$d/pod-logs"
    # Pods' cgroups under a root of the cluster's own, in every controller of cgroup v1.
    for ctl in /sys/fs/cgroup/*/; do
        [ -f "$ctl/cgroup.procs" ] && [ "$(basename "$ctl")" != unified ] && mkdir -p "$ctl$CGROUP_ROOT"
    done
    cat >"$d/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$STATE_DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: $CGROUP_ROOT
enforceNodeAllocatable: [pods]
failCgroupV1: false
failSwapOn: false
resolvConf: ""
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
volumePluginDir: $d/volume-plugins
# Container logs in the state dir, not /var/log/pods: a kubelet removes the log directories of
# pods it does not know, so two real clusters on one machine would delete each other's.
podLogsDir: $d/pod-logs
serializeImagePulls: false
maxPods: 110
podCIDR: $POD_CIDR
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
rotateCertificates: false
serverTLSBootstrap: false
EOF
    start_cmd kubelet "$(bin_path kubelet)" --config="$d/config.yaml" \
        --kubeconfig="$PKI/kubelet-client.kubeconfig" --root-dir="$d/root" --cert-dir="$d/pki" \
        --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" \
        --node-labels="topology.kubernetes.io/zone=zone-a,topology.kubernetes.io/region=local,stateward.test/node=real" \
        --v=0
}

real_proxy_dns_up() {
    cat >"$STATE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $PKI/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# 0: leave the kernel's conntrack table size alone (it is shared with the host).
conntrack: {maxPerCore: 0}
EOF
    start_cmd kube-proxy "$(bin_path kube-proxy)" --config="$STATE_DIR/kube-proxy.yaml" --v=0
    # Health and readiness on ports of their own inside the namespace (not 8080/8181, which
    # a process under test, e.g. the operator's HTTP server, may want).
    cat >"$STATE_DIR/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    health 127.0.0.1:10054
    ready 127.0.0.1:10055
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $PKI/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
EOF
    start_cmd coredns "$(bin_path coredns)" -conf "$STATE_DIR/Corefile"
}

# The RBAC CoreDNS needs, the node's volumes; applied once the API server is up.
real_manifest() {
    cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "stateward:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "stateward:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "stateward:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
EOF
    local j dir
    for j in "${!PV_SIZES[@]}"; do
        dir="$STATE_DIR/volumes/vol$(printf %02d "$j")"
        mkdir -p "$dir"
        cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-$NODE_NAME-$(printf %02d "$j")
  labels: {stateward.test/pool: local}
spec:
  capacity: {storage: ${PV_SIZES[$j]}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  volumeMode: Filesystem
  local: {path: $dir}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$NODE_NAME]}
EOF
    done
}

# The host side reaches the API server, and nothing else, through 127.0.0.1:$APISERVER_PORT:
# each connection is relayed by a socat started inside the namespace.
# Its argv[0] names the state dir, so down recognises it as ours.
real_forwarder_up() {
    setsid bash -c 'exec -a "socat-forwarder $1" socat "$2" "$3"' _ "$STATE_DIR" \
        "TCP-LISTEN:$APISERVER_PORT,bind=127.0.0.1,reuseaddr,fork" \
        "EXEC:nsenter --net=$NETNS_PATH socat STDIO TCP\\:127.0.0.1\\:$APISERVER_PORT" \
        >"$LOGS/forwarder.log" 2>&1 </dev/null 9>&- &
    echo $! >"$PIDS/forwarder.pid"
}

# --- teardown (down --real) -------------------------------------------------------------------

# Every process in the pods' cgroups (containers, whatever they forked), by cgroup, not by name.
real_kill_pods() {
    local ctl pids
    for ctl in /sys/fs/cgroup/pids /sys/fs/cgroup/memory; do
        [ -d "$ctl$CGROUP_ROOT" ] || continue
        # Cgroups vanish while we read them (their processes exit): best effort, never fatal.
        pids="$(find "$ctl$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)" || true
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    done
}

# containerd's shims (found by their -address, which is under our state dir).
real_kill_shims() {
    local pid
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*$STATE_DIR/containerd" || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

real_unmount() {
    local m i
    # Deepest first; lazily, since a dying process may still hold one for a moment.
    for i in 1 2 3; do
        mapfile -t m < <(awk -v p="$STATE_DIR/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r || true)
        [ ${#m[@]} -gt 0 ] || break
        for d in "${m[@]}"; do umount -l "$d" 2>/dev/null || true; done
    done
    # Task bundles and shim sockets containerd keeps under /run/containerd for our namespace.
    mapfile -t m < <(awk '$2 ~ "^/run/containerd/io.containerd.runtime.v2.task/k8s.io/" { print $2 }' /proc/self/mounts)
    for d in "${m[@]}"; do
        [ -d "$d" ] || continue
        grep -qs "$STATE_DIR" "$(dirname "$d")/address" 2>/dev/null && umount -l "$d" 2>/dev/null || true
    done
}

real_cgroups_remove() {
    local ctl
    for ctl in /sys/fs/cgroup/*/; do
        [ -d "$ctl${CGROUP_ROOT#/}" ] || continue
        find "$ctl${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

real_netns_down() {
    if [ -e "$NETNS_PATH" ]; then
        ip netns delete "$NETNS" 2>/dev/null || true
    fi
    rm -rf "/var/lib/cni/results/$CNI_NETWORK-"* 2>/dev/null || true
}
