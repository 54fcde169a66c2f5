package io.gpumemd.client;

import java.nio.ByteBuffer;

/**
 * A process that maps a host segment file ({@code args[0]}, {@code args[1]} bytes), reads it,
 * vacates the mapping and touches it again: which must fault (SIGSEGV ends this JVM), proving
 * that a vacated range is inaccessible. {@link HostMappingAddressTest} runs it and reads its
 * output and exit status.
 */
public final class HostMappingFaultMain {
  private HostMappingFaultMain() {}

  public static void main(String[] args) {
    HostMapping mapping = new HostMapping(args[0], Long.parseLong(args[1]), false);
    ByteBuffer buffer = mapping.slice(0, 4096);
    System.out.println("read " + buffer.get(0));
    mapping.vacate();
    System.out.println("vacated");
    System.out.flush();
    System.out.println("read after vacate " + buffer.get(0)); // faults: never printed
    System.exit(0);
  }
}
