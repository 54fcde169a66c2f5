package io.gpumemd.server.backend;

/**
 * What a client needs to map a segment into its own process: a CUDA IPC memory handle, the
 * path of a shared-memory file, or where to fetch the segment's file descriptor (a host file or
 * a CUDA VMM export). Sealed, so
 * that code handing it out covers every kind (a {@code switch} without default) and never asks
 * a backend for its name. Immutable.
 */
public sealed interface IpcHandle {
  /** The 64 bytes of {@code cuIpcGetMemHandle}, opened with {@code cuIpcOpenMemHandle}. */
  record CudaIpc(byte[] bytes) implements IpcHandle {
    public CudaIpc {
      bytes = bytes.clone();
    }

    @Override
    public byte[] bytes() {
      return bytes.clone();
    }
  }

  /** A shared-memory file the client maps with {@code mmap}. */
  record HostShm(String path) implements IpcHandle {}

  /**
   * A segment passed as a file descriptor ({@link FdPassedSegment}): the client fetches it
   * from the fd channel listening at {@code fdSocket} and maps it with {@code mmap}.
   */
  record HostFd(String fdSocket) implements IpcHandle {}

  /**
   * A CUDA VMM allocation ({@code cuMemCreate}, POSIX fd handle type) passed as a descriptor:
   * the client fetches it from the fd channel listening at {@code fdSocket}, then imports,
   * reserves, maps and sets access ({@code MemoryHandle.cuda_vmm}). Unlike {@link CudaIpc} it
   * opens across PID namespaces.
   */
  record CudaVmm(String fdSocket) implements IpcHandle {}
}
