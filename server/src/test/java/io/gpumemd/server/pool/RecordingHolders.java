package io.gpumemd.server.pool;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * {@link HolderRequests} for pool tests: records every request, and forwards unmap requests to
 * a listener when the test sets one (as a session would act on them). Thread-safe.
 */
public final class RecordingHolders implements HolderRequests {
  /** One request: an unmap ({@code segmentId}), a cache return ({@code bytes}) or overdue. */
  public record Request(String kind, String holder, int device, long value) {}

  private final List<Request> requests = new CopyOnWriteArrayList<>();
  private volatile UnmapListener unmapListener;
  private volatile ReturnListener returnListener;

  /** Acts on an unmap request. */
  @FunctionalInterface
  public interface UnmapListener {
    void requestUnmap(String holder, int device, long segmentId);
  }

  /** Acts on a request to give back client-cached bytes. */
  @FunctionalInterface
  public interface ReturnListener {
    void requestCacheReturn(String holder, int device, long bytes);
  }

  public void onUnmap(UnmapListener listener) {
    this.unmapListener = listener;
  }

  public void onCacheReturn(ReturnListener listener) {
    this.returnListener = listener;
  }

  public List<Request> requests() {
    return List.copyOf(requests);
  }

  public List<Request> requests(String kind) {
    return requests.stream().filter(r -> r.kind().equals(kind)).toList();
  }

  @Override
  public void requestUnmap(String holder, int device, long segmentId) {
    requests.add(new Request("unmap", holder, device, segmentId));
    UnmapListener listener = unmapListener;
    if (listener != null) {
      listener.requestUnmap(holder, device, segmentId);
    }
  }

  @Override
  public void requestCacheReturn(String holder, int device, long bytes) {
    requests.add(new Request("return", holder, device, bytes));
    ReturnListener listener = returnListener;
    if (listener != null) {
      listener.requestCacheReturn(holder, device, bytes);
    }
  }

  @Override
  public void cacheReturnOverdue(String holder) {
    requests.add(new Request("overdue", holder, -1, 0));
  }
}
