# Shared by build, up and down: where things live and which versions are pinned.
# Sourced, not executed.

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATEWARD_CACHE="${STATEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stateward}"
BIN_DIR="$STATEWARD_CACHE/bin"
# Cluster state (certs, etcd data, logs, pids, kubeconfig) lives outside the checkout. The
# real-pods cluster (scripts given --real, which set REAL=1 before sourcing) has its own.
REAL="${REAL:-0}"
if [ "$REAL" = 1 ]; then
    STATE_DIR="${STATEWARD_REAL_CLUSTER_DIR:-$STATEWARD_CACHE/realcluster}"
else
    STATE_DIR="${STATEWARD_CLUSTER_DIR:-$STATEWARD_CACHE/cluster}"
fi

# Loopback ports, chosen away from the usual defaults so a developer's own cluster
# does not collide with ours.
ETCD_PORT="${STATEWARD_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${STATEWARD_ETCD_PEER_PORT:-23800}"
# The real-pods cluster's daemons listen inside its network namespace; only its API server's
# port is also taken on the host's loopback (the forwarder), so it has a variable of its own.
if [ "$REAL" = 1 ]; then
    APISERVER_PORT="${STATEWARD_REAL_APISERVER_PORT:-26543}"
else
    APISERVER_PORT="${STATEWARD_APISERVER_PORT:-26443}"
fi
KCM_PORT="${STATEWARD_KCM_PORT:-26257}"
SCHEDULER_PORT="${STATEWARD_SCHEDULER_PORT:-26259}"
KWOK_PORT="${STATEWARD_KWOK_PORT:-26280}"

die() { echo "tests/cluster: error: $*" >&2; exit 1; }
say() { echo "tests/cluster: $*" >&2; }

# Version of a module as pinned in one of our go.mod files (no Go needed).
gomod_version() { # <go.mod> <module>
    awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}

K8S_VERSION="$(gomod_version "$CLUSTER_DIR/k8s/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(gomod_version "$CLUSTER_DIR/k8s/go.mod" go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(gomod_version "$CLUSTER_DIR/kwok/go.mod" sigs.k8s.io/kwok)"
# CoreDNS is built from our main.go (its plugin list): the digest of that is part of its version.
COREDNS_VERSION="$(gomod_version "$CLUSTER_DIR/coredns/go.mod" github.com/coredns/coredns)-$(sha256sum <"$CLUSTER_DIR/coredns/main.go" | cut -c1-8)"
# The pause program is ours: its version is a digest of its source.
PAUSE_VERSION="src-$(cat "$CLUSTER_DIR/pause/main.go" "$CLUSTER_DIR/pause/go.mod" | sha256sum | cut -c1-12)"
HELM_VERSION="$(gomod_version "$CLUSTER_DIR/helm/go.mod" helm.sh/helm/v4)"

component_version() { # <component>
    case "$1" in
        kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy) echo "$K8S_VERSION" ;;
        etcd) echo "$ETCD_VERSION" ;;
        kwok|kwokctl) echo "$KWOK_VERSION" ;;
        coredns) echo "$COREDNS_VERSION" ;;
        pause) echo "$PAUSE_VERSION" ;;
        helm) echo "$HELM_VERSION" ;;
        *) die "unknown component '$1'" ;;
    esac
}

bin_path() { # <component>
    echo "$BIN_DIR/$1-$(component_version "$1")"
}
