package remote

import (
	"context"
	"errors"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// Timing and bounds of the replicas' addresses a backend asks its
// controllers for (their Peers call), when it reaches them by a name.
//
// PeersRetryMin and PeersRetryMax bound the wait before a Peers stream is
// opened again after it ended (doubling from the first while they end
// without telling anything; the next stream goes to whichever replica is
// up). PeersRetryUnsupported is the wait after a controller said it does
// not tell its replicas (not given its Service, or built before the call):
// it may be replaced by one that does.
const (
	PeersRetryMin         = 250 * time.Millisecond
	PeersRetryMax         = 30 * time.Second
	PeersRetryUnsupported = 5 * time.Minute
)

// followPeers gives names the controller replicas' addresses that the
// controllers behind client tell, until ctx ends: one stream at a time,
// opened again when it ends. The last addresses told are kept when a
// stream ends (its controller gone): they are where the backend goes next;
// they are dropped when a controller says it does not tell its replicas
// (the deployment changed: the name's own addresses are all there is).
func followPeers(ctx context.Context, client kpngv1.ControllerClient, names *resolverBuilder, address string) {
	logger := klog.FromContext(ctx).WithValues("address", address)
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: PeersRetryMin, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: PeersRetryMax}
	}
	backoff := newBackoff()
	var last []string
	for {
		told, err := peersOnce(ctx, client, func(ips []string) {
			if !slices.Equal(ips, last) {
				logger.V(2).Info("The kpng controllers' replicas", "addresses", ips, "before", last)
				last = ips
				names.setPeers(ips)
			}
		})
		if ctx.Err() != nil {
			return
		}
		if told {
			backoff = newBackoff()
		}
		delay := backoff.Step()
		if c := status.Code(err); c == codes.Unimplemented || c == codes.FailedPrecondition {
			if last != nil {
				last = nil
				names.setPeers(nil)
			}
			logger.V(2).Info("The kpng controller does not tell its replicas' addresses; asking again later", "err", err, "retryIn", PeersRetryUnsupported)
			delay = PeersRetryUnsupported
		} else {
			logger.V(4).Info("The stream of the kpng controllers' replicas ended", "err", err, "retryIn", delay.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// peersOnce runs one Peers stream, calling set with each list of addresses
// received (a list with an address that does not parse is skipped). It
// reports whether any list came, and why the stream ended.
func peersOnce(ctx context.Context, client kpngv1.ControllerClient, set func([]string)) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Peers(ctx, &kpngv1.PeersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	told := false
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return told, errors.New("the controller ended the stream")
		}
		if err != nil {
			return told, err
		}
		ips, err := kpngv1.PeerIPs(msg.GetIps())
		if err != nil {
			klog.FromContext(ctx).Error(err, "Ignoring the kpng controller's list of its replicas")
			continue
		}
		told = true
		set(ips)
	}
}
