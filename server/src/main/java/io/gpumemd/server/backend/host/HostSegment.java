package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.SegmentMemory;
import java.nio.file.Path;

/** A host segment: one shared-memory file. Immutable. */
record HostSegment(int device, long bytes, Path path) implements SegmentMemory {
  @Override
  public byte[] cudaIpcHandle() {
    return null;
  }

  @Override
  public String hostShmPath() {
    return path.toString();
  }
}
