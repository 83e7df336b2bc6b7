package notify

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Sink names, the "sink" label of the metrics.
const (
	SinkCommand = "command"
	SinkWebhook = "webhook"
)

// Metrics counts what the sinks did. It is a prometheus.Collector: the
// caller registers it where its other metrics live. Safe for concurrent use.
// Make it with NewMetrics.
type Metrics struct {
	command, webhook                               counts
	descSent, descFailed, descDropped, descRetried *prometheus.Desc
}

type counts struct {
	sent, failed, dropped, retried atomic.Uint64
}

// Counts is a snapshot of one sink's counters.
type Counts struct {
	// Sent: delivered (the command exited 0, the receiver answered 2xx).
	Sent uint64
	// Failed: given up on (refused as malformed, the command failed or
	// timed out, the receiver kept failing or refused it).
	Failed uint64
	// Dropped: never tried (the queue was full, or shutdown came first).
	Dropped uint64
	// Retried: webhook attempts after the first.
	Retried uint64
}

// NewMetrics returns zeroed counters.
func NewMetrics() *Metrics {
	return &Metrics{
		descSent:    prometheus.NewDesc("haia_notify_sent_total", "Review notifications delivered, by sink.", []string{"sink"}, nil),
		descFailed:  prometheus.NewDesc("haia_notify_failed_total", "Review notifications given up on (malformed, command failed or timed out, receiver kept failing), by sink.", []string{"sink"}, nil),
		descDropped: prometheus.NewDesc("haia_notify_dropped_total", "Review notifications dropped without a try (queue full or shutdown), by sink.", []string{"sink"}, nil),
		descRetried: prometheus.NewDesc("haia_notify_retries_total", "Webhook delivery attempts after the first, by sink.", []string{"sink"}, nil),
	}
}

func (m *Metrics) sink(name string) *counts {
	if name == SinkCommand {
		return &m.command
	}
	return &m.webhook
}

// Snapshot returns the counters of sink (SinkCommand or SinkWebhook).
func (m *Metrics) Snapshot(sink string) Counts {
	c := m.sink(sink)
	return Counts{Sent: c.sent.Load(), Failed: c.failed.Load(), Dropped: c.dropped.Load(), Retried: c.retried.Load()}
}

// Register adds the counters to r.
func (m *Metrics) Register(r prometheus.Registerer) error { return r.Register(m) }

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.descSent
	ch <- m.descFailed
	ch <- m.descDropped
	ch <- m.descRetried
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, name := range []string{SinkCommand, SinkWebhook} {
		s := m.Snapshot(name)
		for _, v := range []struct {
			d *prometheus.Desc
			n uint64
		}{{m.descSent, s.Sent}, {m.descFailed, s.Failed}, {m.descDropped, s.Dropped}, {m.descRetried, s.Retried}} {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n), name)
		}
	}
}
