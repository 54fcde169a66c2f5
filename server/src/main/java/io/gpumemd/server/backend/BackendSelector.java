package io.gpumemd.server.backend;

import io.gpumemd.server.backend.cuda.JCudaBackend;
import io.gpumemd.server.backend.cuda.VmmUnavailableException;
import java.util.function.Supplier;

/**
 * Chooses the backend at start: {@code host}, {@code cuda}, or {@code auto} (cuda when the
 * driver loads and reports a device, else host). The choice comes with the reason, which the
 * server logs in one line.
 */
public final class BackendSelector {
  private BackendSelector() {}

  /** A backend and why it was chosen. */
  public record Selection(MemoryBackend backend, String reason) {}

  /**
   * What the cuda backend needs to decide its handles.
   *
   * @param handles {@code auto}, {@code vmm} or {@code legacy} ({@code --cuda-handles})
   * @param fdSocket the fd channel's socket, or null when the daemon has none
   */
  public record CudaOptions(String handles, String fdSocket) {}

  /**
   * @param choice {@code auto}, {@code host} or {@code cuda}
   * @param host makes the host backend, when that is the choice
   * @param cuda how the cuda backend hands segments out, when that is the choice
   * @throws BackendException when {@code --backend cuda} is asked for and no GPU is usable, when
   *     {@code --cuda-handles vmm} cannot work on a GPU that is used, or when the host backend's
   *     directory cannot be used
   */
  public static Selection select(String choice, Supplier<MemoryBackend> host, CudaOptions cuda) {
    switch (choice) {
      case "host":
        return new Selection(host.get(), "--backend host");
      case "cuda":
        try {
          if (JCudaBackend.probe() == 0) {
            throw new BackendException("the CUDA driver loaded but reports no devices");
          }
          return new Selection(JCudaBackend.open(cuda.handles(), cuda.fdSocket()), "--backend cuda");
        } catch (VmmUnavailableException e) {
          throw e; // says itself what is missing and what to use instead
        } catch (BackendException | LinkageError e) {
          throw new BackendException("backend: cuda (expected: a usable NVIDIA GPU and driver; "
              + describe(e) + "). Use --backend host or auto to run without a GPU.");
        }
      default:
        String whyNot;
        try {
          int count = JCudaBackend.probe();
          if (count > 0) {
            return new Selection(JCudaBackend.open(cuda.handles(), cuda.fdSocket()),
                "--backend auto: the CUDA driver reports " + count + " device(s)");
          }
          whyNot = "the CUDA driver loaded but reports no devices";
        } catch (VmmUnavailableException e) {
          throw e; // the operator asked for VMM on a GPU that is there: no quiet fall back to host
        } catch (BackendException | LinkageError e) {
          whyNot = describe(e);
        }
        return new Selection(host.get(), "--backend auto: CUDA is not usable (" + whyNot + ")");
    }
  }

  /** The most telling message of a failure to load or use the driver. */
  static String describe(Throwable e) {
    Throwable root = e;
    while (root.getCause() != null && root.getCause() != root) {
      root = root.getCause();
    }
    String message = root.getMessage() == null ? root.toString() : root.getMessage();
    if (e instanceof LinkageError) {
      // JCuda's message nests both load attempts' stack traces; the telling line is the
      // dynamic linker's about libcuda (e.g. "cannot open shared object file").
      String linker = message.lines().map(String::trim)
          .filter(l -> l.contains("libcuda") && !l.startsWith("at "))
          .map(l -> l.substring(l.indexOf("libcuda")))
          .findFirst().orElse(message.lines().findFirst().orElse(""));
      return "cannot load the CUDA driver library: " + linker;
    }
    return message;
  }
}
