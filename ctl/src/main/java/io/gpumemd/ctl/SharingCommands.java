package io.gpumemd.ctl;

import io.gpumemd.common.Sizes;
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.ObjectInfo;
import io.gpumemd.proto.v1.ParkObjectRequest;
import io.gpumemd.proto.v1.ParkObjectResponse;
import io.gpumemd.proto.v1.RemoveObjectRequest;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.gpumemd.proto.v1.RevokeShareResponse;
import io.gpumemd.proto.v1.ShareInfo;
import io.gpumemd.proto.v1.UnpublishResponse;
import java.io.PrintStream;
import java.util.List;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

/**
 * The commands of sharing: published objects ({@link Objects}, and {@link RemoveObject} and
 * {@link ParkObject} under it)
 * and share tokens ({@link Shares}, {@link RevokeShare}), each an {@link AdminCommand}. Another
 * tenant's objects and tokens need an admin identity; the daemon checks that. Not thread-safe
 * (one command per instance).
 */
final class SharingCommands {
  private SharingCommands() {}

  @Command(name = "objects", description = "published objects with size, holders and age; 'objects rm NAME' removes "
      + "one, 'objects park NAME' parks one in the daemon's host memory")
  static final class Objects extends AdminCommand {
    Objects(GpuMemCtl ctl) {
      super(ctl);
    }

    /** Every published object the caller may see, as one response. */
    @Override
    int run(AdminConnection admin) {
      AdminConnection.Page<ObjectInfo> all = AdminConnection.pages(0, (pageSize, token) -> {
        ListObjectsResponse page = admin.admin().listObjects(ListObjectsRequest.newBuilder().setPageSize(pageSize)
            .setPageToken(token).build());
        return new AdminConnection.Page<>(page.getObjectsList(), page.getTotal(), page.getNextPageToken());
      });
      ListObjectsResponse response = ListObjectsResponse.newBuilder().setTotal(all.total()).addAllObjects(all.items())
          .build();
      return admin.print(response, out -> print(response.getObjectsList(), out));
    }

    private static void print(List<ObjectInfo> objects, PrintStream out) {
      if (objects.isEmpty()) {
        out.println("no published objects");
        return;
      }
      Table table = new Table("NAME", "TENANT", ">DEVICE", ">SIZE", ">HOLDS", ">HOLDERS", ">AGE", "RO", "PARKED");
      for (ObjectInfo o : objects) {
        table.row(o.getName(), o.getTenant(), o.getDevice(), Sizes.format(o.getSizeBytes()), o.getHolds(), o.getHolders(),
            Sizes.formatMillis(o.getAgeMs()), o.getReadOnly() ? "yes" : "no",
            o.getParked() ? Sizes.format(o.getHostBytes()) + " in host memory" : "no");
      }
      table.print(out);
    }
  }

  /** A command on one published object: its name, and its tenant for an admin. */
  abstract static class ObjectCommand extends AdminCommand {
    @Parameters(index = "0", paramLabel = "NAME", description = "the published name")
    String name;
    @Option(names = "--tenant", paramLabel = "T",
        description = "the object's tenant (default: the caller's own; another's needs an admin identity)")
    String tenant = "";

    ObjectCommand(GpuMemCtl ctl) {
      super(ctl);
    }
  }

  @Command(name = "rm", description = "unpublish an object (its block returns once its last hold is gone)")
  static final class RemoveObject extends ObjectCommand {
    RemoveObject(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      UnpublishResponse response = admin.admin().removeObject(RemoveObjectRequest.newBuilder().setTenant(tenant)
          .setName(name).build());
      return admin.print(response, out -> out.println("removed object '" + name + "'"
          + whatBecame(tenant, response.getBlockReturned())));
    }
  }

  @Command(name = "park", description = "park an object nobody but its names holds: its contents to the daemon's "
      + "host memory, its device memory freed; the next lookup brings it back")
  static final class ParkObject extends ObjectCommand {
    ParkObject(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      ParkObjectResponse response = admin.admin().parkObject(ParkObjectRequest.newBuilder().setTenant(tenant)
          .setName(name).build());
      return admin.print(response, out -> out.println(response.getFreedBytes() == 0
          ? "object '" + name + "' was parked already (" + Sizes.format(response.getHostBytes()) + " in host memory)"
          : "parked object '" + name + "': " + Sizes.format(response.getHostBytes()) + " in host memory, "
          + Sizes.format(response.getFreedBytes()) + " of device memory freed"));
    }
  }

  @Command(name = "shares", description = "live share tokens (by id, never the token) with tenant, maker, uses and "
      + "expiry; every tenant's for an admin")
  static final class Shares extends AdminCommand {
    @Option(names = "--tenant", paramLabel = "T",
        description = "only this tenant's tokens (another tenant's needs an admin identity)")
    String tenant = "";

    Shares(GpuMemCtl ctl) {
      super(ctl);
    }

    /** Every share token the caller may see (of {@code --tenant}, when named), as one response. */
    @Override
    int run(AdminConnection admin) {
      AdminConnection.Page<ShareInfo> all = AdminConnection.pages(0, (pageSize, token) -> {
        ListSharesResponse page = admin.admin().listShares(ListSharesRequest.newBuilder().setTenant(tenant)
            .setPageSize(pageSize).setPageToken(token).build());
        return new AdminConnection.Page<>(page.getSharesList(), page.getTotal(), page.getNextPageToken());
      });
      ListSharesResponse response = ListSharesResponse.newBuilder().setTotal(all.total()).addAllShares(all.items())
          .build();
      return admin.print(response, out -> print(response.getSharesList(), out));
    }

    private static void print(List<ShareInfo> shares, PrintStream out) {
      if (shares.isEmpty()) {
        out.println("no live share tokens");
        return;
      }
      Table table = new Table("SHARE ID", "TENANT", "SESSION", "CLIENT", "LEASE", ">DEVICE", ">SIZE", ">HOLDS",
          ">ATTACHES", ">EXPIRES IN", "RO");
      for (ShareInfo h : shares) {
        table.row(h.getShareId(), h.getTenant(), h.getSessionId(), h.getClientName(), h.getLeaseId(), h.getDevice(),
            Sizes.format(h.getSizeBytes()), h.getHolds(), h.getAttaches() + "/" + (h.getMaxAttaches() == 0 ? "any"
                : Integer.toUnsignedString(h.getMaxAttaches())), Sizes.formatMillis(h.getExpiresInMs()),
            h.getReadOnly() ? "yes" : "no");
      }
      table.print(out);
    }
  }

  @Command(name = "revoke-share", description = "revoke a share token by its id from 'shares' (its own hold ends; "
      + "holds taken with it stay)")
  static final class RevokeShare extends AdminCommand {
    @Parameters(index = "0", paramLabel = "SHARE_ID", description = "the token's id, as 'shares' lists it")
    String shareId;
    @Option(names = "--tenant", paramLabel = "T",
        description = "the token's tenant (default: the caller's own; another's needs an admin identity)")
    String tenant = "";

    RevokeShare(GpuMemCtl ctl) {
      super(ctl);
    }

    @Override
    int run(AdminConnection admin) {
      RevokeShareResponse response = admin.admin().removeShare(RemoveShareRequest.newBuilder().setTenant(tenant)
          .setShareId(shareId).build());
      return admin.print(response, out -> out.println("revoked share token " + shareId
          + whatBecame(tenant, response.getBlockReturned())));
    }
  }

  /** The rest of a removal's line: whose it was (when not the caller's own) and where its block went. */
  private static String whatBecame(String tenant, boolean blockReturned) {
    return (tenant.isEmpty() ? "" : " of tenant " + tenant)
        + (blockReturned ? "; its block went back to the pool"
            : "; its block stays leased until its other holders release it");
  }
}
