# The repository at its base commit (HEAD), with the upstream fix on a branch, a tag and the
# reflog: the image preparation must remove every one of them.
set -e
cd /app
git init -q -b main
git config user.email dev@example.com
git config user.name dev
git add calc.py test_calc.py
git commit -q -m "calc: add and mean"
git checkout -q -b upstream-fix
sed -i 's/(len(values) - 1)/len(values)/' calc.py
git commit -q -am "Fix mean: divide by len(values)"
git tag v1.0.1
git checkout -q main
git stash list >/dev/null
