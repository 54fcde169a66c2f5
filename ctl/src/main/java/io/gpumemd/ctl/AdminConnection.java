package io.gpumemd.ctl;

import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.MessageOrBuilder;
import com.google.protobuf.util.JsonFormat;
import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.grpc.health.v1.HealthGrpc;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * One admin command's connection to the daemon and what every admin command does with it: the
 * Admin and health stubs, each call under {@link #DEADLINE_SECONDS}; a listing followed page by
 * page ({@link #pages}); and the response printed, with {@code --json}, as the message in the
 * protobuf JSON mapping (lowerCamelCase names, 64-bit integers as strings, zero values included
 * so that scripts find every field), else as the command's text ({@link #print}).
 *
 * <p>Opened and closed by {@link AdminCommand#call}, one per command. Not thread-safe.
 */
final class AdminConnection implements AutoCloseable {
  /** Admin calls are quick; a daemon that does not answer in this time is reported. */
  private static final long DEADLINE_SECONDS = 10;
  /** Pages asked of the daemon: its default page size, well within a message's bounds. */
  private static final int PAGE_SIZE = 1000;
  private static final JsonFormat.Printer JSON = JsonFormat.printer().includingDefaultValueFields();

  private final Channels.Connection connection;
  private final AdminGrpc.AdminBlockingStub admin;
  private final boolean json;
  private final PrintStream out;

  /** Opens the channel; a malformed target or an unreadable TLS or token file is a usage error. */
  AdminConnection(GpuMemCtl ctl) {
    this.connection = ctl.open();
    this.admin = AdminGrpc.newBlockingStub(connection.channel());
    this.json = ctl.json();
    this.out = ctl.out();
  }

  /** The Admin service, for one call. */
  AdminGrpc.AdminBlockingStub admin() {
    return admin.withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
  }

  /** The grpc.health.v1 service, for one call. */
  HealthGrpc.HealthBlockingStub health() {
    return HealthGrpc.newBlockingStub(connection.channel()).withDeadlineAfter(DEADLINE_SECONDS, TimeUnit.SECONDS);
  }

  /**
   * Prints {@code response} as JSON with {@code --json}, else has {@code text} print it for a
   * person; returns 0, the exit code of a call that succeeded.
   */
  int print(MessageOrBuilder response, Consumer<PrintStream> text) {
    if (!json) {
      text.accept(out);
      return 0;
    }
    try {
      out.println(JSON.print(response));
    } catch (InvalidProtocolBufferException e) {
      throw new IllegalStateException("cannot print " + response.getClass().getSimpleName() + " as JSON", e);
    }
    return 0;
  }

  /** A page of a listing, or all of them: the items, the total as the daemon counted it, the next page's token. */
  record Page<T>(List<T> items, long total, String nextToken) {}

  /** One listing call: at most {@code pageSize} items, from {@code token} on ("" for the first page). */
  @FunctionalInterface
  interface PageCall<T> {
    Page<T> fetch(int pageSize, String token);
  }

  /**
   * Every matching item (at most {@code limit}, 0 = all), following the daemon's pages, as one
   * page: the items in order and the total as the first page counted it.
   */
  static <T> Page<T> pages(int limit, PageCall<T> call) {
    List<T> items = new ArrayList<>();
    long total = 0;
    String token = "";
    do {
      int want = limit == 0 ? PAGE_SIZE : Math.min(PAGE_SIZE, limit - items.size());
      Page<T> page = call.fetch(want, token);
      if (token.isEmpty()) {
        total = page.total();
      }
      items.addAll(page.items());
      token = page.nextToken();
    } while (!token.isEmpty() && (limit == 0 || items.size() < limit));
    return new Page<>(items, total, "");
  }

  @Override
  public void close() {
    connection.close();
  }
}
