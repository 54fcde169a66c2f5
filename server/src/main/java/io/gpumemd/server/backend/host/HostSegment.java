package io.gpumemd.server.backend.host;

import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import java.nio.file.Path;

/** A host segment: one shared-memory file. Immutable. */
record HostSegment(int device, long bytes, Path path, IpcHandle.HostShm handle) implements SegmentMemory {
  HostSegment(int device, long bytes, Path path) {
    this(device, bytes, path, new IpcHandle.HostShm(path.toString()));
  }
}
