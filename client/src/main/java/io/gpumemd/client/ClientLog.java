package io.gpumemd.client;

/** The client library's logger name. */
final class ClientLog {
  /**
   * One name for every log line of the client, the facade's as it always was, so that an
   * operator's logging configuration keeps working whichever class logs.
   */
  static final String NAME = "io.gpumemd.client.GpuMemClient";

  private ClientLog() {}
}
