package io.gpumemd.client;

import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The GPU work of this process that may still use a closing session's memory, waited for before
 * the session's blocks go back to the daemon (CloseSession): the primary context of every CUDA
 * device the session maps is synchronized ({@code cuCtxSynchronize}). That covers the leases
 * still open and the stream-ordered releases ({@link CudaLeases#closeAfter}) whose events had
 * not completed: their streams belong to that context. Destroying an event does not wait for
 * the work before it, and the daemon leases a returned block to the next process at once.
 *
 * <p>{@code cuCtxSynchronize} cannot be bounded, so it runs on a thread of its own ({@code
 * gpumemd-client-gpu-sync}, a daemon thread) and the closing thread waits for it up to its
 * bound: {@link #await} says whether the work is {@link Outcome#DONE done}, still {@link
 * Outcome#RUNNING running}, or {@link Outcome#FAILED failed} (a sticky context error: what
 * became of the queued work is unknown).
 *
 * <p>Thread-safe.
 */
final class QueuedGpuWork {
  /** What {@link #await} found. */
  enum Outcome {
    /** Every device synchronized (or none to synchronize): the blocks can go back. */
    DONE,
    /** Still synchronizing at the bound. */
    RUNNING,
    /** A synchronize failed: the work's state is unknown. */
    FAILED
  }

  private final Set<Integer> devices;
  private final CompletableFuture<Void> synced;

  private QueuedGpuWork(Set<Integer> devices, CompletableFuture<Void> synced) {
    this.devices = devices;
    this.synced = synced;
  }

  /** Starts synchronizing {@code devices} (this process's ordinals); none: already done. */
  static QueuedGpuWork synchronize(Set<Integer> devices) {
    CompletableFuture<Void> synced = new CompletableFuture<>();
    if (devices.isEmpty()) {
      synced.complete(null);
      return new QueuedGpuWork(devices, synced);
    }
    Thread thread = new Thread(() -> {
      try {
        for (int device : devices) {
          CudaMappings.synchronize(device);
        }
        synced.complete(null);
      } catch (RuntimeException | LinkageError e) {
        synced.completeExceptionally(e);
      }
    }, "gpumemd-client-gpu-sync");
    thread.setDaemon(true);
    thread.start();
    return new QueuedGpuWork(devices, synced);
  }

  /** The devices synchronized (this process's ordinals). */
  Set<Integer> devices() {
    return devices;
  }

  /** Waits up to {@code millis} (0: not at all); see {@link Outcome}. */
  Outcome await(long millis) {
    try {
      synced.get(Math.max(0, millis), TimeUnit.MILLISECONDS);
      return Outcome.DONE;
    } catch (TimeoutException e) {
      return Outcome.RUNNING;
    } catch (ExecutionException e) {
      return Outcome.FAILED;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return synced.isDone() && !synced.isCompletedExceptionally() ? Outcome.DONE : Outcome.RUNNING;
    }
  }

  /** Waits without a bound: DONE or FAILED. */
  Outcome awaitEnd() {
    try {
      synced.join();
      return Outcome.DONE;
    } catch (RuntimeException e) {
      return Outcome.FAILED;
    }
  }

  /** Why the synchronize failed, for the log; null when it did not. */
  String failure() {
    if (!synced.isCompletedExceptionally()) {
      return null;
    }
    try {
      synced.join();
      return null;
    } catch (RuntimeException e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      return cause.toString();
    }
  }
}
