// Package imagevolume decides, when the operator starts, how job pods get the supervisor
// and buildkite-agent (podbuilder.Binaries): from image volumes where the cluster has
// them, else by the init containers' copy, which works everywhere.
//
// Image volumes need three things: the API server to keep a pod's spec.volumes[].image
// (the ImageVolume feature, on by default from Kubernetes 1.35), the kubelet to mount them
// (the same feature, same release), and a container runtime that has them (containerd 2.1
// or CRI-O 1.31 and later). Kubernetes cannot be asked whether a node's runtime has them,
// so the decision reads the versions every node reports; a pod scheduled to a node
// without them would never start.
package imagevolume

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// The operator reads the nodes' versions once, at start-up (Choose).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list

// Mode is what the operator is told (--binaries-from): Auto, or one of podbuilder's
// Binaries to take without asking.
type Mode string

// Auto takes image volumes when Choose finds the cluster has them.
const Auto Mode = "auto"

// Modes are the values of --binaries-from.
var Modes = []Mode{Auto, Mode(podbuilder.BinariesImageVolume), Mode(podbuilder.BinariesInitContainer)}

// Set makes Mode a flag.Value that takes only Modes.
func (m *Mode) Set(v string) error {
	for _, ok := range Modes {
		if Mode(v) == ok {
			*m = ok
			return nil
		}
	}
	return fmt.Errorf("%q: use auto, image-volume or init-container", v)
}

func (m *Mode) String() string {
	if m == nil {
		return ""
	}
	return string(*m)
}

// The releases from which each part has image volumes.
var (
	// minKubernetes is the first release with ImageVolume on by default (beta, 1.35), and
	// with a subPath of an image volume (1.33), which the pod builder mounts.
	minKubernetes = version.MustParseGeneric("1.35.0")
	minContainerd = version.MustParseGeneric("2.1.0")
	minCRIO       = version.MustParseGeneric("1.31.0")
)

// Decision is how job pods get their binaries, and why, for the operator's log.
type Decision struct {
	Binaries podbuilder.Binaries
	Reason   string
}

// Choose decides for mode: itself unless Auto; for Auto, image volumes when the API server
// (serverVersion, as discovery gives it, "v1.35.4") and every node that nodes lists have
// them. Nodes it may not list, or none at all, give the copy: a pod that cannot start is
// worse than one that starts a little later.
func Choose(ctx context.Context, mode Mode, serverVersion string, nodes client.Reader) (Decision, error) {
	if mode != Auto {
		return Decision{Binaries: podbuilder.Binaries(mode), Reason: "--binaries-from=" + string(mode)}, nil
	}
	copyBecause := func(format string, args ...any) Decision {
		return Decision{Binaries: podbuilder.BinariesInitContainer, Reason: fmt.Sprintf(format, args...)}
	}
	if why := tooOld("the API server", serverVersion, minKubernetes); why != "" {
		return copyBecause("%s (image volumes are on by default from Kubernetes %s)", why, minKubernetes), nil
	}
	nodeCount, why, err := eachNodeHas(ctx, nodes)
	if err != nil {
		if apierrors.IsForbidden(err) {
			return copyBecause("the operator may not list nodes, so it cannot tell whether their container runtimes have image volumes; grant it `list` on nodes or set --binaries-from=image-volume"), nil
		}
		return Decision{}, fmt.Errorf("listing nodes to tell whether they have image volumes: %w", err)
	}
	switch {
	case nodeCount == 0:
		return copyBecause("the cluster has no nodes yet, so none could say whether it has image volumes"), nil
	case why != "":
		return copyBecause("%s; set --binaries-from=image-volume once every node has them", why), nil
	}
	return Decision{Binaries: podbuilder.BinariesImageVolume, Reason: fmt.Sprintf(
		"the API server is %s and each of the %d nodes runs a kubelet and a container runtime that have image volumes", serverVersion, nodeCount)}, nil
}

// nodePage is how many nodes are listed at a time: a node's status lists the images it
// holds, so a large cluster's nodes at once would be a large response held in memory.
var nodePage int64 = 100

// eachNodeHas lists the nodes a page at a time and returns how many it read and why the
// first one that lacks image volumes does (nodeLacks), "" when none does: then the count is
// every node's.
func eachNodeHas(ctx context.Context, nodes client.Reader) (count int, why string, err error) {
	cont := ""
	for {
		var list corev1.NodeList
		if err := nodes.List(ctx, &list, client.Limit(nodePage), client.Continue(cont)); err != nil {
			return 0, "", err
		}
		for i := range list.Items {
			if why := nodeLacks(&list.Items[i]); why != "" {
				return count + i + 1, why, nil
			}
		}
		count += len(list.Items)
		if cont = list.Continue; cont == "" {
			return count, "", nil
		}
	}
}

// nodeLacks says why node cannot mount image volumes, or "" when it can.
func nodeLacks(node *corev1.Node) string {
	info := node.Status.NodeInfo
	if why := tooOld("the kubelet of node "+node.Name, info.KubeletVersion, minKubernetes); why != "" {
		return why
	}
	runtime, v, _ := strings.Cut(info.ContainerRuntimeVersion, "://")
	switch runtime {
	case "containerd":
		return tooOld("node "+node.Name+"'s containerd", v, minContainerd)
	case "cri-o":
		return tooOld("node "+node.Name+"'s CRI-O", v, minCRIO)
	}
	return fmt.Sprintf("node %s runs container runtime %q, of which the operator does not know whether it has image volumes (containerd %s and CRI-O %s do)",
		node.Name, info.ContainerRuntimeVersion, minContainerd, minCRIO)
}

// tooOld says that what is at version v, older than min or not a version, lacks image
// volumes, or "" when v is min or later.
func tooOld(what, v string, min *version.Version) string {
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return fmt.Sprintf("%s reports version %q, which is not a version the operator can compare", what, v)
	}
	if parsed.LessThan(min) {
		return fmt.Sprintf("%s is %s, older than %s", what, v, min)
	}
	return ""
}
