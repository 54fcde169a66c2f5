package io.gpumemd.server.grpc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Descriptors.FieldDescriptor;
import io.gpumemd.proto.v1.DeviceStats;
import io.gpumemd.server.pool.PoolMetric;
import java.util.EnumSet;
import java.util.Set;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;

/** The pool's figures and the {@code DeviceStats} message name the same things. */
class ProtoMappingTest {
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
