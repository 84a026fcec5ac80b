// Package imagevolume decides, when the operator starts, how job pods get the supervisor
// and buildkite-agent (podbuilder.Binaries): from image volumes where the cluster has
// them, else by the init containers' copy, which works everywhere.
//
// Image volumes need three things: the API server to keep a pod's spec.volumes[].image
// (the ImageVolume feature, on by default from Kubernetes 1.35), the kubelet to mount them
// (the same feature, same release), and a container runtime that has them (containerd 2.1
// or CRI-O 1.31 and later). Kubernetes cannot be asked whether a node's runtime has them,
// so the decision reads the versions every node reports; a pod scheduled to a node
// without them would never start. The API server can be asked: a dry-run pod with an
// image volume tells whether its ImageVolume feature gate was turned off, which its
// version cannot.
package imagevolume

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// The operator reads the nodes' versions once, at start-up (Choose), and tries a pod with
// an image volume in the job namespace as a dry run (it creates job pods there anyway).
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

// Cluster is what Choose asks: the API server's version, as discovery gives it ("v1.35.4"),
// the nodes, and the job namespace, where a pod with an image volume is tried as a
// server-side dry run (nothing is stored) with Image in its container and its volume.
type Cluster struct {
	ServerVersion string
	Nodes         client.Reader
	Pods          client.Writer
	Namespace     string
	Image         string
}

// Choose decides for mode: itself unless Auto; for Auto, image volumes when the API server
// and every node have them, and the API server takes a pod with one in the job namespace.
// Nodes it may not list, or none at all, or a pod refused, give the copy: a pod that cannot
// start is worse than one that starts a little later.
func Choose(ctx context.Context, mode Mode, cluster Cluster) (Decision, error) {
	if mode != Auto {
		return Decision{Binaries: podbuilder.Binaries(mode), Reason: "--binaries-from=" + string(mode)}, nil
	}
	copyBecause := func(format string, args ...any) Decision {
		return Decision{Binaries: podbuilder.BinariesInitContainer, Reason: fmt.Sprintf(format, args...)}
	}
	serverVersion, nodes := cluster.ServerVersion, cluster.Nodes
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
	switch err := tryPod(ctx, cluster); {
	case errors.Is(err, errVolumeDropped):
		return copyBecause("the API server dropped the image volume of a pod tried in namespace %s (a dry run), as it does with the ImageVolume feature gate off; "+
			"turn the gate on, then restart the operator", cluster.Namespace), nil
	case err != nil:
		return copyBecause("the API server refused a pod with an image volume in namespace %s (a dry run: %v); set --binaries-from=image-volume if job pods are admitted with them", cluster.Namespace, err), nil
	}
	return Decision{Binaries: podbuilder.BinariesImageVolume, Reason: fmt.Sprintf(
		"the API server is %s and takes pods with image volumes, and each of the %d nodes runs a kubelet and a container runtime that have them", serverVersion, nodeCount)}, nil
}

// errVolumeDropped: the API server's answer to tryPod has no image volume.
var errVolumeDropped = errors.New("the API server dropped the pod's image volume")

// tryPod creates, as a server-side dry run, a pod with an image volume in the job
// namespace, and errVolumeDropped when the answer lacks it: an API server whose
// ImageVolume feature gate is off drops the field (Kubernetes 1.35 answers with no volume
// at all), while its version says nothing of the gate; an admission policy that forbids
// image volumes refuses the pod. The pod meets the restricted Pod Security Standard, as job pods
// do, so that the namespace's own level does not refuse it for another reason.
func tryPod(ctx context.Context, cluster Cluster) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "bk-operator-image-volume-check-", Namespace: cluster.Namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](1000),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "check",
				Image: cluster.Image,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "image", MountPath: "/image", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "image", VolumeSource: corev1.VolumeSource{
				Image: &corev1.ImageVolumeSource{Reference: cluster.Image, PullPolicy: corev1.PullIfNotPresent},
			}}},
		},
	}
	if err := cluster.Pods.Create(ctx, pod, client.DryRunAll); err != nil {
		return err
	}
	for _, v := range pod.Spec.Volumes {
		if v.Image != nil {
			return nil
		}
	}
	return errVolumeDropped
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
