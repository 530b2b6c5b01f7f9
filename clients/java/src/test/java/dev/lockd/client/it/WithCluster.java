package dev.lockd.client.it;

import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolver;

/** Resolves a {@link Cluster} parameter to the suite's shared cluster. */
public final class WithCluster implements ParameterResolver {
  @Override
  public boolean supportsParameter(ParameterContext p, ExtensionContext ctx) {
    return p.getParameter().getType() == Cluster.class;
  }

  @Override
  public Object resolveParameter(ParameterContext p, ExtensionContext ctx) {
    return SharedCluster.get(ctx);
  }
}
