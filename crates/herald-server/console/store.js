// Shared state fed by the cluster event stream; views subscribe to it.

const listeners = new Set();

export const store = {
  cluster: null,      // latest ClusterView
  receivedAt: 0,      // performance.now() when it arrived (for local countdowns)
  status: "connecting",
  // Whether `cluster` is older than the stream: from the moment it
  // reconnects until its first view after that.
  stale: false,
  rates: null,        // {interval_ms, samples} once the rates view loaded them

  // fn(kind) is called with "cluster" or "status"; returns an unsubscribe.
  subscribe(fn) {
    listeners.add(fn);
    return () => listeners.delete(fn);
  },

  setCluster(view) {
    this.cluster = view;
    this.receivedAt = performance.now();
    this.stale = this.status === "reconnecting";
    // Append the sample to the rate history, once per distinct time.
    const rate = view && view.rate;
    if (this.rates && rate) {
      const samples = this.rates.samples;
      const last = samples[samples.length - 1];
      if (!last || rate.at_ms > last.at_ms) {
        samples.push(rate);
        if (samples.length > 300) samples.splice(0, samples.length - 300);
      }
    }
    emit("cluster");
  },

  setStatus(status) {
    this.status = status;
    // A live stream makes the view fresh only with its first view.
    if (status === "reconnecting") this.stale = true;
    emit("status");
  },

  reset() {
    this.cluster = null;
    this.rates = null;
    this.status = "connecting";
    this.stale = false;
  },
};

function emit(kind) {
  for (const fn of listeners) {
    try { fn(kind); } catch (e) { console.error(e); }
  }
}
