// The pod sandbox ("pause") process of the real-pods cluster, built by ../build and packed
// into an image by ../images: no registry is reachable here.
module stateward.local/testcluster/pause

go 1.24.0
