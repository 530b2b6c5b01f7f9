// Command controller is an example Kubernetes-style controller whose leader is elected through
// lockd: client-go's leaderelection.RunOrDie with the k8slock adapter in place of a Lease lock.
// It prints one JSON line per event on stdout:
//
//	{"event":"new_leader","identity":"b","leader":"a"}
//	{"event":"started_leading","identity":"a","token":17}
//	{"event":"working","identity":"a","token":17}          (every -work-every while leading)
//	{"event":"lost","identity":"a","token":17}              (the lockd lock's local deadline passed)
//	{"event":"stopped_leading","identity":"a"}
//
// and exits once it stops leading (as controllers do: a new process campaigns afresh).
//
//	go run ./examples/controller -endpoints 127.0.0.1:7170,127.0.0.1:7171,127.0.0.1:7172 -id a
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	lockd "github.com/lockd-dev/lockd/clients/go"
	"github.com/lockd-dev/lockd/clients/go/k8slock"
)

var outMu sync.Mutex

func emit(kv map[string]any) {
	b, _ := json.Marshal(kv)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(b))
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:7170,127.0.0.1:7171,127.0.0.1:7172", "lockd gRPC endpoints, comma-separated")
	name := flag.String("name", "leaders/example-controller", "the election's lock name")
	id := flag.String("id", lockd.HostPID(), "this replica's identity (unique among the replicas)")
	ttl := flag.Duration("ttl", 10*time.Second, "lockd session TTL")
	lease := flag.Duration("lease", 15*time.Second, "LeaseDuration")
	renew := flag.Duration("renew", 10*time.Second, "RenewDeadline")
	retry := flag.Duration("retry", 2*time.Second, "RetryPeriod")
	workEvery := flag.Duration("work-every", time.Second, "how often the leader does (prints) its work")
	caFile := flag.String("ca-file", "", "the cluster's CA (TLS)")
	token := flag.String("token", "", "bearer token of the namespace")
	namespace := flag.String("namespace", "", "lockd namespace of the session")
	flag.Parse()
	klog.SetOutput(os.Stderr)

	if err := k8slock.CheckTiming(*lease, *renew, *retry, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "warning:", err)
	}
	opts := []lockd.Option{lockd.WithTTL(*ttl), lockd.WithClientName(*id), lockd.WithNamespace(*namespace)}
	if *caFile != "" {
		opts = append(opts, lockd.WithCAFile(*caFile))
	}
	if *token != "" {
		opts = append(opts, lockd.WithToken(*token))
	}
	client, err := lockd.New(strings.Split(*endpoints, ","), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer client.Close(context.Background())
	lock, err := k8slock.New(client, *name, *id)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            *name,
		LeaseDuration:   *lease,
		RenewDeadline:   *renew,
		RetryPeriod:     *retry,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				// Work stops when client-go stops leading (ctx) or, sooner, at the lockd lock's
				// local deadline; every side effect carries the term's fencing token.
				wctx, token, cancel := lock.WithLeadership(ctx)
				defer cancel()
				emit(map[string]any{"event": "started_leading", "identity": *id, "token": token})
				t := time.NewTicker(*workEvery)
				defer t.Stop()
				for {
					select {
					case <-wctx.Done():
						if ctx.Err() == nil {
							emit(map[string]any{"event": "lost", "identity": *id, "token": token})
						}
						return
					case <-t.C:
						emit(map[string]any{"event": "working", "identity": *id, "token": token})
					}
				}
			},
			OnStoppedLeading: func() {
				emit(map[string]any{"event": "stopped_leading", "identity": *id})
			},
			OnNewLeader: func(identity string) {
				emit(map[string]any{"event": "new_leader", "identity": *id, "leader": identity})
			},
		},
	})
}
