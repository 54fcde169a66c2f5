package io.gpumemd.it.cuda;

import io.gpumemd.server.backend.cuda.JCudaBackend;

/** Whether this machine has a usable CUDA device, and why not; computed once. */
public final class CudaAvailability {
  private static final String REASON;

  static {
    String reason;
    try {
      int count = JCudaBackend.probe();
      reason = count > 0 ? null : "the CUDA driver reports no devices";
    } catch (Throwable t) {
      reason = "no usable CUDA driver (" + t.getClass().getSimpleName() + ": " + t.getMessage() + ")";
    }
    REASON = reason;
  }

  private CudaAvailability() {}

  /** Null when a GPU is usable, else why the CUDA tests are skipped. */
  public static String whyNot() {
    return REASON == null ? null : "CUDA tests skipped: " + REASON;
  }

  /** Skips the calling test, printing the reason, where no GPU is usable. */
  public static void assumeUsable() {
    String why = whyNot();
    if (why != null) {
      System.out.println(why);
    }
    org.junit.jupiter.api.Assumptions.assumeTrue(why == null, why);
  }
}
