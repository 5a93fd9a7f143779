def my_sgd(problem, batch_size, lr, epochs, seed=0):
    """Mini-batch SGD on the toy; returns the (w, b) at the start and after every step."""
    rng = np.random.default_rng(seed)
    params = np.array(sgd_toy.START, dtype=float)
    path = [params]
    for _ in range(epochs):
        order = rng.permutation(problem.n_samples)
        for first in range(0, problem.n_samples, batch_size):
            batch = order[first:first + batch_size]
            params = params - lr * problem.gradient(params, batch)
            path.append(params)
    return path
