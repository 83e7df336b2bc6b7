// Resolve hooks for running Haia Trace core's TypeScript sources as they
// are in the repository: Node strips the types, and a relative import
// written with its built name (./event.js) is found as its source
// (./event.ts) when no .js file exists.
export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context);
  } catch (err) {
    if (err?.code === "ERR_MODULE_NOT_FOUND" && specifier.startsWith(".") && specifier.endsWith(".js")) {
      return next(specifier.slice(0, -3) + ".ts", context);
    }
    throw err;
  }
}
