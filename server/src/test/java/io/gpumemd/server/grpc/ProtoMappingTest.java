package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Descriptors.FieldDescriptor;
import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.proto.v1.MemoryHandle;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.HolderRequests;
import io.gpumemd.server.pool.InMemoryBackend;
import io.gpumemd.server.pool.PoolMetric;
import io.gpumemd.server.pool.PoolSettings;
import java.util.EnumSet;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

/**
 * The pool's figures and the {@code DeviceStats} message name the same things; segment handles and
 * device facts reach their proto fields.
 */
class ProtoMappingTest {
  private static final long MiB = 1L << 20;

  @Test
  void setKind_aCudaVmmSegment_isCudaVmmWithItsFdSocket() {
    MemoryHandle handle =
        ProtoMapping.setKind(MemoryHandle.newBuilder(), new IpcHandle.CudaVmm("/run/g.sock.fd")).build();

    assertEquals(MemoryHandle.KindCase.CUDA_VMM, handle.getKindCase());
    assertEquals("/run/g.sock.fd", handle.getCudaVmm().getFdSocket());
  }

  @Test
  void setKind_theOtherKinds_keepTheirFields() {
    assertEquals(MemoryHandle.KindCase.FD_SEGMENT,
        ProtoMapping.setKind(MemoryHandle.newBuilder(), new IpcHandle.HostFd("/x.fd")).getKindCase());
    assertEquals(MemoryHandle.KindCase.CUDA_IPC_HANDLE,
        ProtoMapping.setKind(MemoryHandle.newBuilder(), new IpcHandle.CudaIpc(new byte[64])).getKindCase());
    assertEquals("/dev/shm/s", ProtoMapping.setKind(MemoryHandle.newBuilder(), new IpcHandle.HostShm("/dev/shm/s"))
        .getHostShmPath());
  }

  @Test
  void deviceInfo_carriesTheDevicesCudaHandles() {
    InMemoryBackend backend = new InMemoryBackend(64 * MiB);
    HolderRequests nobody = new HolderRequests() {
      @Override
      public void requestUnmap(String holder, int device, long segmentId) {}

      @Override
      public void requestCacheReturn(String holder, int device, long bytes) {}

      @Override
      public void cacheReturnOverdue(String holder) {}
    };
    DeviceInfo gpu = new DeviceInfo(0, "NVIDIA H100", "GPU-1", "cuda", 64 * MiB, 64 * MiB, "vmm");
    try (DevicePool vmm = new DevicePool(gpu, backend, new PoolSettings(64 * MiB, 0, 0), nobody, 0, Ticker.system());
        DevicePool host = new DevicePool(backend.devices().get(0), backend, new PoolSettings(64 * MiB, 0, 0), nobody,
            1L << 48, Ticker.system())) {
      assertEquals("vmm", ProtoMapping.deviceInfo(vmm).getCudaHandles());
      assertEquals("", ProtoMapping.deviceInfo(host).getCudaHandles(), "empty where the device is not CUDA");
    }
  }
  @Test
  void everyDeviceStatsFigure_hasAPoolMetric_andBackAgain() {
    Set<String> unmatchedFields = new TreeSet<>();
    Set<PoolMetric> matched = EnumSet.noneOf(PoolMetric.class);
    for (FieldDescriptor field : DeviceStats.getDescriptor().getFields()) {
      if (field.getName().equals("device")) {
        continue;
      }
      PoolMetric metric = null;
      for (PoolMetric m : PoolMetric.values()) {
        if (m.protoField().equals(field.getName())) {
          metric = m;
        }
      }
      if (metric == null) {
        unmatchedFields.add(field.getName());
      } else {
        matched.add(metric);
      }
    }
    assertTrue(unmatchedFields.isEmpty(), "DeviceStats fields without a PoolMetric: " + unmatchedFields);
    assertEquals(EnumSet.allOf(PoolMetric.class), matched, "PoolMetrics without a DeviceStats field");
  }
}
