package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removeAllPods stops and removes every pod sandbox through containerd's CRI service, as
// the kubelet would: containers are killed, the CNI plugin releases the pod's address and
// veth, and the network namespace is unmounted. The kubelet must already be stopped, or it
// would start them again.
func removeAllPods(ctx context.Context, socket string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to containerd at %s: %w", socket, err)
	}
	defer func() { _ = conn.Close() }()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	sandboxes, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range sandboxes.Items {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping pod %s/%s: %w", sb.GetMetadata().GetNamespace(), sb.GetMetadata().GetName(), err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing pod %s/%s: %w", sb.GetMetadata().GetNamespace(), sb.GetMetadata().GetName(), err))
		}
	}
	return errors.Join(errs...)
}
